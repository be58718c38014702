// specbound's GEMM for llama.cpp's K-quant weights (Q4_K, Q6_K) with 8-bit activations, on x86 CPUs.
//
// Weights keep the GGUF file's own values: a row's 256-weight super-block holds codes q (4-bit for
// Q4_K, 6-bit for Q6_K, kept in 4 and 6 bits as in the file), one integer scale per group (32 weights for
// Q4_K, 16 for Q6_K) and per super-block float factors d (and dmin):
//     Q4_K: w = d * sc_g * q - dmin * m_g        (q in 0..15, sc_g and m_g in 0..63)
//     Q6_K: w = d * sc_g * (q - 32)              (q in 0..63, sc_g in -128..127)
// Activations are rounded per row and per 32 inputs to int8 (scale = max|x| / 127). For one row x and
// one output, with I_g = sum q * xq and X_g = sum xq over group g (exact int32 sums, VNNI vpdpbusd):
//     Q4_K: y = sum_s [ d_s * A_s - dmin_s * B_s ],  A_s = sum_g sc_g * (I_g * xs_g),  B_s = sum_g m_g * (xs_g * X_g)
//     Q6_K: y = sum_s d_s * A_s,                     A_s = sum_g sc_g * ((I_g - 32 X_g) * xs_g)
// Every float operation is written out (fused multiply-adds named as such, contraction off) in a fixed
// order that does not depend on how many rows a call reads, so each row's output is the same whatever
// the batch (batch-invariant, tested bit for bit), and the AVX-512 VNNI path equals the portable path
// bit for bit (tested). Output rows are split between threads in blocks of 16; each output is computed
// whole by one thread.
//
// Layout, per weight tensor of R output rows (R % 16 == 0) and C input columns (C % 256 == 0), in
// blocks of 16 output rows ("lane" r = row 16*b + r):
//   codes: Q4_K (group 32): [R/16][groups][256 bytes], 4 chunks of 64 bytes; in chunk c the byte
//          4*r + j holds q[r][8c + j] (low nibble) and q[r][8c + 4 + j] (high nibble).
//          Q6_K (group 16): [R/16][groups][192 bytes], 6 bits per code as in the file: with
//          q_c = q[r][4c + j] (c = 0..3), byte 4*r + j of the first 64 holds q_0 & 15 | (q_2 & 15) << 4,
//          of the next 64 q_1 & 15 | (q_3 & 15) << 4, of the last 64 the high bits
//          q_0 >> 4 | (q_1 >> 4) << 2 | (q_2 >> 4) << 4 | (q_3 >> 4) << 6.
//   sc, mn: [R/16][groups][16] bytes (mn: Q4_K only);  d, dmin: [R/16][C/256][16] float32.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kLanes = 16;      // output rows per block
constexpr int64_t kSuper = 256;     // inputs per super-block
constexpr int64_t kActBlock = 32;   // inputs per activation scale
constexpr int64_t kRowsPerPass = 8; // activation rows whose accumulators stay in registers
constexpr int64_t kPrefetch = 8192; // bytes ahead in the code stream (measured: 2 KB 52 ms, 8 KB 36 ms per 1.26 GB at k = 1)
constexpr int64_t kQ4Bytes = 256;   // code bytes per group and 16-row block: Q4_K (32 inputs x 16 rows x 4 bits)
constexpr int64_t kQ6Bytes = 192;   //                                         Q6_K (16 inputs x 16 rows x 6 bits)

// Q6_K code of lane r, input 4c + j of a group (the layout above)
inline int32_t q6_code(const uint8_t* cg, int c, int r, int j) {
  const uint8_t low = cg[(c & 1) * 64 + 4 * r + j];
  const uint8_t high = cg[128 + 4 * r + j];
  return int32_t(c < 2 ? low & 15 : low >> 4) | (int32_t((high >> (2 * c)) & 3) << 4);
}

struct Activations {
  std::vector<int8_t> q;       // [k][C]
  std::vector<float> xs;       // [k][C / 32]   scale of each 32 inputs
  std::vector<int32_t> sums;   // [k][C / 16]   sum of xq over each 16 inputs
  std::vector<float> xs_sum32; // [k][C / 32]   xs * (sum of xq over the 32 inputs), for Q4_K's mins
  std::vector<int32_t> off16;  // [k][C / 16]   32 * (sum of xq over the 16 inputs), for Q6_K's offset

  Activations(int64_t k, int64_t c)
      : q(k * c), xs(k * (c / kActBlock)), sums(k * (c / 16)), xs_sum32(k * (c / kActBlock)), off16(k * (c / 16)) {}
};

Activations quantize_rows(const float* x, int64_t k, int64_t c) {
  Activations a(k, c);
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t b = 0; b < c / kActBlock; ++b) {
      const float* v = x + i * c + b * kActBlock;
      float amax = 0.0f;
      for (int j = 0; j < kActBlock; ++j) amax = std::fmax(amax, std::fabs(v[j]));
      float scale = amax / 127.0f;
      float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      a.xs[i * (c / kActBlock) + b] = scale;
      int8_t* out = a.q.data() + i * c + b * kActBlock;
      for (int j = 0; j < kActBlock; ++j) {
        float r = std::nearbyint(v[j] * inv);
        r = std::fmin(127.0f, std::fmax(-127.0f, r));
        out[j] = static_cast<int8_t>(r);
      }
      for (int h = 0; h < 2; ++h) {
        int32_t s = 0;
        for (int j = 0; j < 16; ++j) s += out[16 * h + j];
        a.sums[i * (c / 16) + 2 * b + h] = s;
        a.off16[i * (c / 16) + 2 * b + h] = 32 * s;
      }
      a.xs_sum32[i * (c / kActBlock) + b] =
          scale * float(a.sums[i * (c / 16) + 2 * b] + a.sums[i * (c / 16) + 2 * b + 1]);
    }
  }
  return a;
}

// The same rounding with AVX-512 (the same float operations per value: |v|, max, one division each for
// scale and inverse, v * inv rounded to nearest even, clamped): the same bytes and sums as
// quantize_rows. It runs once per call and row of x, before the weights are read, so at k rows per
// call its cost is paid k times per layer: the scalar loop above (nearbyint through libm) cost as much as
// streaming the weights once at k = 8.
__attribute__((target("avx512f,avx512bw,avx512vl")))
Activations quantize_rows_vector(const float* x, int64_t k, int64_t c) {
  Activations a(k, c);
  const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t b = 0; b < c / kActBlock; ++b) {
      const float* v = x + i * c + b * kActBlock;
      const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
      // max_ps(x, acc) returns acc where x is NaN, as std::fmax does
      __m512 m = _mm512_max_ps(_mm512_abs_ps(v1), _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps()));
      const float amax = _mm512_reduce_max_ps(m);
      const float scale = amax / 127.0f;
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      a.xs[i * (c / kActBlock) + b] = scale;
      const __m512 iv = _mm512_set1_ps(inv);
      int32_t half[2];
      for (int h = 0; h < 2; ++h) {
        __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(h ? v1 : v0, iv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
        const __m512i q = _mm512_cvtps_epi32(r);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a.q.data() + i * c + b * kActBlock + 16 * h), _mm512_cvtepi32_epi8(q));
        half[h] = _mm512_reduce_add_epi32(q);
        a.sums[i * (c / 16) + 2 * b + h] = half[h];
        a.off16[i * (c / 16) + 2 * b + h] = 32 * half[h];
      }
      a.xs_sum32[i * (c / kActBlock) + b] = scale * float(half[0] + half[1]);
    }
  }
  return a;
}

// ------------------------------------------------------------------ portable path (the definition)
void block_q4_portable(const uint8_t* codes, const uint8_t* sc, const uint8_t* mn, const float* d,
                       const float* dmin, const Activations& a, int64_t row0, int64_t nrows, int64_t c,
                       float* y, int64_t ystride) {
  const int64_t supers = c / kSuper;
  for (int64_t i = row0; i < row0 + nrows; ++i) {
    for (int r = 0; r < kLanes; ++r) {
      float out = 0.0f;
      for (int64_t s = 0; s < supers; ++s) {
        float A = 0.0f, B = 0.0f;
        for (int g8 = 0; g8 < 8; ++g8) {
          const int64_t g = s * 8 + g8;
          const uint8_t* cg = codes + g * kQ4Bytes;
          const int8_t* xq = a.q.data() + i * c + g * 32;
          int32_t I = 0;
          for (int ch = 0; ch < 4; ++ch)
            for (int j = 0; j < 4; ++j) {
              uint8_t byte = cg[ch * 64 + 4 * r + j];
              I += int32_t(byte & 15) * xq[8 * ch + j] + int32_t(byte >> 4) * xq[8 * ch + 4 + j];
            }
          const float xs = a.xs[i * (c / 32) + g];
          const float xsX = a.xs_sum32[i * (c / 32) + g];
          A = std::fma(float(sc[g * 16 + r]), float(I) * xs, A);
          B = std::fma(float(mn[g * 16 + r]), xsX, B);
        }
        out = std::fma(d[s * 16 + r], A, out);
        out = std::fma(-dmin[s * 16 + r], B, out);
      }
      y[i * ystride + r] = out;
    }
  }
}

void block_q6_portable(const uint8_t* codes, const int8_t* sc, const float* d, const Activations& a,
                       int64_t row0, int64_t nrows, int64_t c, float* y, int64_t ystride) {
  const int64_t supers = c / kSuper;
  for (int64_t i = row0; i < row0 + nrows; ++i) {
    for (int r = 0; r < kLanes; ++r) {
      float out = 0.0f;
      for (int64_t s = 0; s < supers; ++s) {
        float A = 0.0f;
        for (int g16 = 0; g16 < 16; ++g16) {
          const int64_t g = s * 16 + g16;
          const uint8_t* cg = codes + g * kQ6Bytes;
          const int8_t* xq = a.q.data() + i * c + g * 16;
          int32_t I = 0;
          for (int ch = 0; ch < 4; ++ch)
            for (int j = 0; j < 4; ++j) I += q6_code(cg, ch, r, j) * xq[4 * ch + j];
          const int32_t J = I - a.off16[i * (c / 16) + g];
          const float xs = a.xs[i * (c / 32) + g / 2];
          A = std::fma(float(sc[g * 16 + r]), float(J) * xs, A);
        }
        out = std::fma(d[s * 16 + r], A, out);
      }
      y[i * ystride + r] = out;
    }
  }
}

// ------------------------------------------------------------------ AVX-512 VNNI path (the same operations)
// acc += codes (u8) . 4 activation bytes at p (s8), broadcast to every lane from memory ({1to16}: one
// instruction, where the intrinsic form costs a separate broadcast per call)
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
inline __m512i dot4(__m512i acc, __m512i codes, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(codes), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

template <int nrows>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
void block_q4_vnni(const uint8_t* codes, const uint8_t* sc, const uint8_t* mn, const float* d,
                   const float* dmin, const Activations& a, int64_t row0, int64_t c,
                   float* y, int64_t ystride) {
  const int64_t supers = c / kSuper;
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int8_t* xq0 = a.q.data();
  const float* xs0 = a.xs.data();
  const float* xsx0 = a.xs_sum32.data();
  __m512 out[nrows], A[nrows], B[nrows];
  for (int i = 0; i < nrows; ++i) out[i] = _mm512_setzero_ps();
  for (int64_t s = 0; s < supers; ++s) {
    for (int i = 0; i < nrows; ++i) A[i] = B[i] = _mm512_setzero_ps();
    for (int g8 = 0; g8 < 8; ++g8) {
      const int64_t g = s * 8 + g8;
      const uint8_t* cg = codes + g * kQ4Bytes;
      for (int line = 0; line < 4; ++line) _mm_prefetch((const char*)(cg + kPrefetch + 64 * line), _MM_HINT_T0);
      __m512i w[8];
      for (int ch = 0; ch < 4; ++ch) {
        __m512i raw = _mm512_loadu_si512(cg + 64 * ch);
        w[2 * ch] = _mm512_and_si512(raw, low);
        w[2 * ch + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
      }
      const __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(sc + g * 16))));
      const __m512 mnf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(mn + g * 16))));
      for (int i = 0; i < nrows; ++i) {
        const int64_t row = row0 + i;
        const int8_t* xq = xq0 + row * c + g * 32;
        __m512i I0 = dot4(_mm512_setzero_si512(), w[0], xq);
        __m512i I1 = dot4(_mm512_setzero_si512(), w[1], xq + 4);
        for (int ch = 1; ch < 4; ++ch) {
          I0 = dot4(I0, w[2 * ch], xq + 8 * ch);
          I1 = dot4(I1, w[2 * ch + 1], xq + 8 * ch + 4);
        }
        const __m512 fI = _mm512_cvtepi32_ps(_mm512_add_epi32(I0, I1));
        A[i] = _mm512_fmadd_ps(scf, _mm512_mul_ps(fI, _mm512_set1_ps(xs0[row * (c / 32) + g])), A[i]);
        B[i] = _mm512_fmadd_ps(mnf, _mm512_set1_ps(xsx0[row * (c / 32) + g]), B[i]);
      }
    }
    const __m512 dv = _mm512_loadu_ps(d + s * 16), mv = _mm512_loadu_ps(dmin + s * 16);
    for (int i = 0; i < nrows; ++i) {
      out[i] = _mm512_fmadd_ps(dv, A[i], out[i]);
      out[i] = _mm512_fnmadd_ps(mv, B[i], out[i]);
    }
  }
  for (int i = 0; i < nrows; ++i) _mm512_storeu_ps(y + (row0 + i) * ystride, out[i]);
}

template <int nrows>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
void block_q6_vnni(const uint8_t* codes, const int8_t* sc, const float* d, const Activations& a,
                   int64_t row0, int64_t c, float* y, int64_t ystride) {
  const int64_t supers = c / kSuper;
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  __m512 out[nrows], A[nrows];
  const int8_t* xq0 = a.q.data();
  const float* xs0 = a.xs.data();
  const int32_t* off0 = a.off16.data();
  for (int i = 0; i < nrows; ++i) out[i] = _mm512_setzero_ps();
  for (int64_t s = 0; s < supers; ++s) {
    for (int i = 0; i < nrows; ++i) A[i] = _mm512_setzero_ps();
    for (int g16 = 0; g16 < 16; ++g16) {
      const int64_t g = s * 16 + g16;
      const uint8_t* cg = codes + g * kQ6Bytes;
      for (int line = 0; line < 3; ++line) _mm_prefetch((const char*)(cg + kPrefetch + 64 * line), _MM_HINT_T0);
      // 6-bit codes: low nibbles of chunks 0/2 and 1/3, then the high two bits of all four;
      // code = low | (high bits moved to bits 4-5): one ternary-logic op each (A | (B & C) = 0xF8)
      const __m512i a01 = _mm512_loadu_si512(cg), a23 = _mm512_loadu_si512(cg + 64), h = _mm512_loadu_si512(cg + 128);
      __m512i w[4];
      w[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(a01, low4), _mm512_slli_epi16(h, 4), bits45, 0xF8);
      w[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(a23, low4), _mm512_slli_epi16(h, 2), bits45, 0xF8);
      w[2] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(a01, 4), low4), h, bits45, 0xF8);
      w[3] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(a23, 4), low4), _mm512_srli_epi16(h, 2),
                                       bits45, 0xF8);
      const __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(sc + g * 16))));
      for (int i = 0; i < nrows; ++i) {
        const int64_t row = row0 + i;
        const int8_t* xq = xq0 + row * c + g * 16;
        __m512i I0 = dot4(_mm512_set1_epi32(-off0[row * (c / 16) + g]), w[0], xq);
        __m512i I1 = dot4(_mm512_setzero_si512(), w[1], xq + 4);
        I0 = dot4(I0, w[2], xq + 8);
        I1 = dot4(I1, w[3], xq + 12);
        const __m512 fJ = _mm512_cvtepi32_ps(_mm512_add_epi32(I0, I1));
        A[i] = _mm512_fmadd_ps(scf, _mm512_mul_ps(fJ, _mm512_set1_ps(xs0[row * (c / 32) + g / 2])), A[i]);
      }
    }
    const __m512 dv = _mm512_loadu_ps(d + s * 16);
    for (int i = 0; i < nrows; ++i) out[i] = _mm512_fmadd_ps(dv, A[i], out[i]);
  }
  for (int i = 0; i < nrows; ++i) _mm512_storeu_ps(y + (row0 + i) * ystride, out[i]);
}

// f(std::integral_constant<int, n>) for n in 1..kRowsPerPass: the vector kernels keep one accumulator
// per row in registers, so the row count is a compile-time constant.
template <typename F>
void dispatch_rows(int64_t n, F&& f) {
  switch (n) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

bool has_vnni() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return yes;
}

// x [k, C] float32 contiguous -> y [k, R]
at::Tensor kq_gemm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& sc, const at::Tensor& mn,
                   const at::Tensor& d, const at::Tensor& dmin, int64_t kind, int64_t portable) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "kq_gemm: x must be [k, C] float32 contiguous");
  TORCH_CHECK(kind == 4 || kind == 6, "kq_gemm: kind must be 4 (Q4_K) or 6 (Q6_K)");
  const int64_t k = x.size(0), c = x.size(1);
  TORCH_CHECK(c % kSuper == 0, "kq_gemm: input width must be a multiple of 256");
  const int64_t group_bytes = kind == 4 ? kQ4Bytes : kQ6Bytes;
  TORCH_CHECK(codes.dim() == 3 && codes.size(2) == group_bytes && codes.is_contiguous(), "kq_gemm: codes must be ",
              "[blocks, groups, ", group_bytes, "] bytes for this kind");
  const int64_t blocks = codes.size(0);
  const int64_t groups = kind == 4 ? c / 32 : c / 16;
  TORCH_CHECK(codes.size(1) == groups, "kq_gemm: codes hold ", codes.size(1), " groups, the input needs ", groups);
  TORCH_CHECK(sc.numel() == blocks * groups * 16 && d.numel() == blocks * (c / kSuper) * 16, "kq_gemm: bad scales");
  if (kind == 4) TORCH_CHECK(mn.numel() == blocks * groups * 16 && dmin.numel() == d.numel(), "kq_gemm: bad mins");
  at::Tensor y = at::empty({k, blocks * kLanes}, x.options());
  if (k == 0) return y;
  const bool vector = !portable && has_vnni();
  const Activations a = vector ? quantize_rows_vector(x.data_ptr<float>(), k, c) : quantize_rows(x.data_ptr<float>(), k, c);
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const float* dp = d.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t ys = blocks * kLanes;
  const int64_t code_stride = groups * group_bytes, sc_stride = groups * 16, d_stride = (c / kSuper) * 16;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t row0 = 0; row0 < k; row0 += kRowsPerPass) {
        const int64_t n = std::min<int64_t>(kRowsPerPass, k - row0);
        float* yb = yp + b * kLanes;
        if (kind == 4) {
          const uint8_t* s = static_cast<const uint8_t*>(sc.data_ptr()) + b * sc_stride;
          const uint8_t* m = static_cast<const uint8_t*>(mn.data_ptr()) + b * sc_stride;
          const float* dm = dmin.data_ptr<float>() + b * d_stride;
          if (vector) dispatch_rows(n, [&](auto rows) {
            block_q4_vnni<decltype(rows)::value>(cp + b * code_stride, s, m, dp + b * d_stride, dm, a, row0, c, yb, ys);
          });
          else block_q4_portable(cp + b * code_stride, s, m, dp + b * d_stride, dm, a, row0, n, c, yb, ys);
        } else {
          const int8_t* s = static_cast<const int8_t*>(sc.data_ptr()) + b * sc_stride;
          if (vector) dispatch_rows(n, [&](auto rows) {
            block_q6_vnni<decltype(rows)::value>(cp + b * code_stride, s, dp + b * d_stride, a, row0, c, yb, ys);
          });
          else block_q6_portable(cp + b * code_stride, s, dp + b * d_stride, a, row0, n, c, yb, ys);
        }
      }
    }
  });
  return y;
}

bool kq_vector() { return has_vnni(); }

}  // namespace

TORCH_LIBRARY(specbound_kq, m) {
  m.def("gemm(Tensor x, Tensor codes, Tensor sc, Tensor mn, Tensor d, Tensor dmin, int kind, int portable) -> Tensor");
  m.def("vector_path() -> bool");
}

TORCH_LIBRARY_IMPL(specbound_kq, CPU, m) { m.impl("gemm", kq_gemm); }
TORCH_LIBRARY_IMPL(specbound_kq, CompositeExplicitAutograd, m) { m.impl("vector_path", kq_vector); }
