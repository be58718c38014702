// specbound's GEMM for llama.cpp's K-quant weights (Q4_K, Q6_K) with 8-bit activations: the arithmetic,
// one variant per CPU family, with no torch in it (the torch operator is kquant.cpp).
//
// Weights keep the GGUF file's own values: a row's 256-weight super-block holds codes q (4-bit for
// Q4_K, 6-bit for Q6_K, kept in 4 and 6 bits as in the file), one integer scale per group (32 weights for
// Q4_K, 16 for Q6_K) and per super-block float factors d (and dmin):
//     Q4_K: w = d * sc_g * q - dmin * m_g        (q in 0..15, sc_g and m_g in 0..63)
//     Q6_K: w = d * sc_g * (q - 32)              (q in 0..63, sc_g in -128..127)
// Activations are rounded per row and per 32 inputs to int8 (scale = max|x| / 127, codes in -127..127).
// For one row x and one output, with I_g = sum q * xq and X_g = sum xq over group g (exact int32 sums):
//     Q4_K: y = sum_s [ d_s * A_s - dmin_s * B_s ],  A_s = sum_g sc_g * (I_g * xs_g),  B_s = sum_g m_g * (xs_g * X_g)
//     Q6_K: y = sum_s d_s * A_s,                     A_s = sum_g sc_g * ((I_g - 32 X_g) * xs_g)
// The integer sums are exact on every path (any order gives the same int32), and every float operation
// is written out (fused multiply-adds named as such, contraction off) in one fixed order per output, so
// every path gives the portable path's bits, and a row's output does not depend on the other rows of
// the call (batch-invariant). Both are tested bit for bit, the ARM paths under an emulator.
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
// A 512-bit register holds the 16 lanes of a block; the 256-bit paths take a block as two halves of 8
// lanes, NEON as four quarters of 4.
#include "kquant_core.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) || defined(_M_X64)
#define KQ_X86 1
#include <cpuid.h>
#include <immintrin.h>
// VEX-encoded 256-bit vpdpbusd (_mm256_dpbusd_avx_epi32) needs GCC 11 / clang 12
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define KQ_HAVE_AVXVNNI 1
#endif
#elif defined(__aarch64__)
#define KQ_ARM 1
#include <arm_neon.h>
#if defined(__linux__)
#include <sys/auxv.h>
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#if defined(__clang__)
#define KQ_DOTPROD __attribute__((target("dotprod")))
#define KQ_I8MM __attribute__((target("dotprod,i8mm")))
#else
#define KQ_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#define KQ_I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#endif
#endif

namespace kq {
namespace {

constexpr int64_t kPrefetch = 8192;  // bytes ahead in the code stream (measured: 2 KB 52 ms, 8 KB 36 ms per 1.26 GB at k = 1)

inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline void prefetch(const uint8_t* p) { __builtin_prefetch(p, 0, 3); }

// Q6_K code of lane r, input 4c + j of a group (the layout above)
inline int32_t q6_code(const uint8_t* cg, int c, int r, int j) {
  const uint8_t low = cg[(c & 1) * 64 + 4 * r + j];
  const uint8_t high = cg[128 + 4 * r + j];
  return int32_t(c < 2 ? low & 15 : low >> 4) | (int32_t((high >> (2 * c)) & 3) << 4);
}

// The scale of one 32-input block and the reciprocal its values are multiplied by (every path: two
// float divisions, as here).
struct BlockScale {
  float scale, inv;
  explicit BlockScale(float amax) : scale(amax / 127.0f), inv(amax > 0.0f ? 127.0f / amax : 0.0f) {}
};

// Record block b of row i once its 32 codes are written: the scale and the sums of each 16.
inline void finish_block(Activations& a, int64_t i, int64_t b, float scale, int32_t s0, int32_t s1) {
  const int64_t c = a.c;
  a.xs[i * (c / kActBlock) + b] = scale;
  a.sums[i * (c / 16) + 2 * b] = s0;
  a.sums[i * (c / 16) + 2 * b + 1] = s1;
  a.off16[i * (c / 16) + 2 * b] = 32 * s0;
  a.off16[i * (c / 16) + 2 * b + 1] = 32 * s1;
  a.xs_sum32[i * (c / kActBlock) + b] = scale * float(s0 + s1);
}

// ------------------------------------------------------------------ portable path (the definition)
void quantize_portable(const float* x, Activations& a) {
  const int64_t c = a.c;
  for (int64_t i = 0; i < a.k; ++i) {
    for (int64_t b = 0; b < c / kActBlock; ++b) {
      const float* v = x + i * c + b * kActBlock;
      float amax = 0.0f;
      for (int j = 0; j < kActBlock; ++j) amax = std::fmax(amax, std::fabs(v[j]));
      const BlockScale bs(amax);
      int8_t* out = a.q.data() + i * c + b * kActBlock;
      int32_t s[2] = {0, 0};
      for (int j = 0; j < kActBlock; ++j) {
        float r = std::nearbyint(v[j] * bs.inv);
        r = std::fmin(127.0f, std::fmax(-127.0f, r));
        out[j] = static_cast<int8_t>(r);
        s[j / 16] += out[j];
      }
      finish_block(a, i, b, bs.scale, s[0], s[1]);
    }
  }
}

void q4_portable(const Weights& w, int64_t b, const Activations& a, int64_t row0, int64_t nrows, float* y,
                 int64_t ystride) {
  const int64_t c = w.c, groups = c / 32, supers = c / kSuper;
  const uint8_t* codes = w.codes + b * groups * kQ4Bytes;
  const uint8_t* sc = w.sc + b * groups * 16;
  const uint8_t* mn = w.mn + b * groups * 16;
  const float* d = w.d + b * supers * 16;
  const float* dmin = w.dmin + b * supers * 16;
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
              const uint8_t byte = cg[ch * 64 + 4 * r + j];
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
      y[i * ystride + b * kLanes + r] = out;
    }
  }
}

void q6_portable(const Weights& w, int64_t b, const Activations& a, int64_t row0, int64_t nrows, float* y,
                 int64_t ystride) {
  const int64_t c = w.c, groups = c / 16, supers = c / kSuper;
  const uint8_t* codes = w.codes + b * groups * kQ6Bytes;
  const int8_t* sc = reinterpret_cast<const int8_t*>(w.sc) + b * groups * 16;
  const float* d = w.d + b * supers * 16;
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
      y[i * ystride + b * kLanes + r] = out;
    }
  }
}

// f(std::integral_constant<int, n>) for n in 1..8: the vector kernels keep one accumulator per row in
// registers, so the row count is a compile-time constant.
template <typename F>
inline void dispatch_rows(int64_t n, F&& f) {
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

}  // namespace
}  // namespace kq

#if KQ_X86
#include "kquant_x86.inc"
#endif
#if KQ_ARM
#include "kquant_arm.inc"
#endif

namespace kq {

const char* path_name(int path) {
  static const char* const names[kPathCount] = {"portable", "avx2", "avxvnni", "avx512vnni", "neon", "neon-i8mm"};
  return path >= 0 && path < kPathCount ? names[path] : "unknown";
}

unsigned supported_paths() {
  static const unsigned mask = [] {
    unsigned m = 1u << kPortable;
#if KQ_X86
    m |= x86::supported();
#endif
#if KQ_ARM
    m |= arm::supported();
#endif
    return m;
  }();
  return mask;
}

int best_path() {
  const unsigned m = supported_paths();
  for (int p : {kAvx512Vnni, kAvxVnni, kAvx2, kNeonI8mm, kNeon})
    if (m >> p & 1u) return p;
  return kPortable;
}

Activations::Activations(int64_t rows, int64_t cols)
    : k(rows), c(cols), q(rows * cols), xs(rows * (cols / kActBlock)), sums(rows * (cols / 16)),
      xs_sum32(rows * (cols / kActBlock)), off16(rows * (cols / 16)) {}

Activations quantize_rows(int path, const float* x, int64_t k, int64_t c) {
  Activations a(k, c);
  switch (path) {
#if KQ_X86
    case kAvx512Vnni: x86::quantize_512(x, a); break;
    case kAvx2:
    case kAvxVnni: x86::quantize_256(x, a); break;
#endif
#if KQ_ARM
    case kNeon:
    case kNeonI8mm: arm::quantize(x, a); break;
#endif
    default: quantize_portable(x, a);
  }
  return a;
}

void gemm_blocks(int path, const Weights& w, const Activations& a, int64_t block_begin, int64_t block_end,
                 float* y, int64_t ystride) {
  for (int64_t b = block_begin; b < block_end; ++b) {
#if KQ_X86
    if (path != kPortable) {
      x86::gemm_block(path, w, b, a, y, ystride);
      continue;
    }
#endif
#if KQ_ARM
    if (path != kPortable) {
      arm::gemm_block(path, w, b, a, y, ystride);
      continue;
    }
#endif
    if (w.kind == 4) q4_portable(w, b, a, 0, a.k, y, ystride);
    else q6_portable(w, b, a, 0, a.k, y, ystride);
  }
}

}  // namespace kq
