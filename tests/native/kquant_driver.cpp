// A stand-alone driver of the K-quant core (src/specbound/models/kquant_core.cpp) for tests that run it
// where torch does not: cross-compiled for ARM and run under an emulator. It reads one weight tensor
// and activation rows from a file, computes y on every kernel path this CPU supports, and writes them.
//
//   kquant_driver IN OUT
//   IN:  int64 kind, blocks, c, k; then codes, sc, mn (Q4_K only), d, dmin (Q4_K only), x [k, c] float32
//   OUT: per supported path: int64 length of its name, the name, then y [k, 16 * blocks] float32
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kquant_core.h"

namespace {

template <typename T>
std::vector<T> read_array(FILE* f, size_t n) {
  std::vector<T> v(n);
  if (n && std::fread(v.data(), sizeof(T), n, f) != n) {
    std::fprintf(stderr, "kquant_driver: input file too short\n");
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: kquant_driver IN OUT\n");
    return 2;
  }
  FILE* in = std::fopen(argv[1], "rb");
  if (!in) return 2;
  const std::vector<int64_t> head = read_array<int64_t>(in, 4);
  const int64_t kind = head[0], blocks = head[1], c = head[2], k = head[3];
  const int64_t groups = kind == 4 ? c / 32 : c / 16, supers = c / kq::kSuper;
  const std::vector<uint8_t> codes = read_array<uint8_t>(in, blocks * groups * (kind == 4 ? kq::kQ4Bytes : kq::kQ6Bytes));
  const std::vector<uint8_t> sc = read_array<uint8_t>(in, blocks * groups * 16);
  const std::vector<uint8_t> mn = read_array<uint8_t>(in, kind == 4 ? blocks * groups * 16 : 0);
  const std::vector<float> d = read_array<float>(in, blocks * supers * 16);
  const std::vector<float> dmin = read_array<float>(in, kind == 4 ? blocks * supers * 16 : 0);
  const std::vector<float> x = read_array<float>(in, k * c);
  std::fclose(in);

  kq::Weights w;
  w.kind = int(kind);
  w.blocks = blocks;
  w.c = c;
  w.codes = codes.data();
  w.sc = sc.data();
  w.mn = kind == 4 ? mn.data() : nullptr;
  w.d = d.data();
  w.dmin = kind == 4 ? dmin.data() : nullptr;
  FILE* out = std::fopen(argv[2], "wb");
  if (!out) return 2;
  std::vector<float> y(k * blocks * kq::kLanes);
  for (int p = 0; p < kq::kPathCount; ++p) {
    if (!(kq::supported_paths() >> p & 1u)) continue;
    const kq::Activations a = kq::quantize_rows(p, x.data(), k, c);
    kq::gemm_blocks(p, w, a, 0, blocks, y.data(), blocks * kq::kLanes);
    const char* name = kq::path_name(p);
    const int64_t len = int64_t(std::strlen(name));
    std::fwrite(&len, sizeof(len), 1, out);
    std::fwrite(name, 1, len, out);
    std::fwrite(y.data(), sizeof(float), y.size(), out);
  }
  std::fclose(out);
  return 0;
}
