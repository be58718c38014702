// specbound's K-quant GEMM, the arithmetic alone: plain C++ with no torch in it, so that the same core
// builds into the torch operator (kquant.cpp) and into a stand-alone driver that a cross-compiler and an
// emulator run (tests/native/kquant_driver.cpp). kquant_core.cpp documents the layout and the sums.
//
// One kernel variant per CPU family, chosen at load from what the CPU and the OS say they support
// (CPUID and XGETBV on x86, the kernel's hardware capabilities on ARM), never from the flags of the
// machine that compiled it; the portable path is the definition every other path equals bit for bit.
#pragma once

#include <cstdint>
#include <vector>

namespace kq {

// Kernel paths, by number (the torch operator takes the number). Names: path_name().
enum Path : int {
  kPortable = 0,    // plain C++: the definition
  kAvx2 = 1,        // 256-bit vpmaddubsw + vpmaddwd (Haswell and later, AMD Zen 1-3)
  kAvxVnni = 2,     // 256-bit VEX vpdpbusd (Intel Alder Lake and later client cores, AMD Zen 5)
  kAvx512Vnni = 3,  // 512-bit vpdpbusd (Intel Ice Lake / Sapphire Rapids, AMD Zen 4)
  kNeon = 4,        // ARMv8.2 dot product, vdotq_s32 (Apple M, Graviton 2+, Ampere)
  kNeonI8mm = 5,    // ARMv8.6 int8 matrix multiply, vmmlaq_s32, for reads of 2+ rows (Apple M2+, Graviton 3+)
  kPathCount = 6,
};

const char* path_name(int path);
// Bit p set = path p compiled into this build AND supported by this CPU and OS.
unsigned supported_paths();
// The fastest supported path, by the order above (portable when nothing else runs).
int best_path();

constexpr int64_t kLanes = 16;      // output rows per block
constexpr int64_t kSuper = 256;     // inputs per super-block
constexpr int64_t kActBlock = 32;   // inputs per activation scale
constexpr int64_t kQ4Bytes = 256;   // code bytes per group and 16-row block: Q4_K (32 inputs x 16 rows x 4 bits)
constexpr int64_t kQ6Bytes = 192;   //                                         Q6_K (16 inputs x 16 rows x 6 bits)

// k rows of activations rounded to int8 per 32 inputs (scale max|x| / 127) and the sums the kernels need.
struct Activations {
  int64_t k = 0, c = 0;
  std::vector<int8_t> q;       // [k][C]
  std::vector<float> xs;       // [k][C / 32]   scale of each 32 inputs
  std::vector<int32_t> sums;   // [k][C / 16]   sum of xq over each 16 inputs
  std::vector<float> xs_sum32; // [k][C / 32]   xs * (sum of xq over the 32 inputs), for Q4_K's mins
  std::vector<int32_t> off16;  // [k][C / 16]   32 * (sum of xq over the 16 inputs), for Q6_K's offset

  Activations(int64_t rows, int64_t cols);
};

// Round x [k, C] (C % 256 == 0); every path gives the same bytes and sums.
Activations quantize_rows(int path, const float* x, int64_t k, int64_t c);

// One K-quant weight tensor in the kernel's layout (kquant_core.cpp): R = 16 * blocks output rows, C inputs.
struct Weights {
  int kind = 4;                       // 4 = Q4_K, 6 = Q6_K
  int64_t blocks = 0, c = 0;
  const uint8_t* codes = nullptr;     // [blocks][groups][kQ4Bytes or kQ6Bytes]
  const uint8_t* sc = nullptr;        // [blocks][groups][16]   (Q6_K: int8 values)
  const uint8_t* mn = nullptr;        // [blocks][groups][16]   Q4_K only
  const float* d = nullptr;           // [blocks][C / 256][16]
  const float* dmin = nullptr;        // [blocks][C / 256][16]  Q4_K only
};

// y[i][16 b + r] for every row i of a and every block b in [block_begin, block_end); y is [k][ystride].
// Each output is computed whole here, in an order that depends neither on k nor on the block range.
void gemm_blocks(int path, const Weights& w, const Activations& a, int64_t block_begin, int64_t block_end,
                 float* y, int64_t ystride);

}  // namespace kq
