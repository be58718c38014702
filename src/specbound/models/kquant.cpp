// The torch operator over specbound's K-quant GEMM (kquant_core.cpp holds the arithmetic and its layout):
// argument checks, the output tensor, and output blocks of 16 rows split between threads. Each output is
// computed whole by one thread, so the thread count changes no bit.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <string>

#include "kquant_core.h"

namespace {

// x [k, C] float32 contiguous -> y [k, R], on kernel path `path` (kq::Path; supported on this CPU)
at::Tensor kq_gemm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& sc, const at::Tensor& mn,
                   const at::Tensor& d, const at::Tensor& dmin, int64_t kind, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "kq_gemm: x must be [k, C] float32 contiguous");
  TORCH_CHECK(kind == 4 || kind == 6, "kq_gemm: kind must be 4 (Q4_K) or 6 (Q6_K)");
  TORCH_CHECK(path >= 0 && path < kq::kPathCount && (kq::supported_paths() >> path & 1u), "kq_gemm: kernel path ",
              kq::path_name(int(path)), " does not run on this CPU");
  const int64_t k = x.size(0), c = x.size(1);
  TORCH_CHECK(c % kq::kSuper == 0, "kq_gemm: input width must be a multiple of 256");
  const int64_t group_bytes = kind == 4 ? kq::kQ4Bytes : kq::kQ6Bytes;
  TORCH_CHECK(codes.dim() == 3 && codes.size(2) == group_bytes && codes.is_contiguous(), "kq_gemm: codes must be ",
              "[blocks, groups, ", group_bytes, "] bytes for this kind");
  const int64_t blocks = codes.size(0);
  const int64_t groups = kind == 4 ? c / 32 : c / 16;
  TORCH_CHECK(codes.size(1) == groups, "kq_gemm: codes hold ", codes.size(1), " groups, the input needs ", groups);
  TORCH_CHECK(sc.numel() == blocks * groups * 16 && d.numel() == blocks * (c / kq::kSuper) * 16, "kq_gemm: bad scales");
  if (kind == 4) TORCH_CHECK(mn.numel() == blocks * groups * 16 && dmin.numel() == d.numel(), "kq_gemm: bad mins");
  at::Tensor y = at::empty({k, blocks * kq::kLanes}, x.options());
  if (k == 0) return y;
  const kq::Activations a = kq::quantize_rows(int(path), x.data_ptr<float>(), k, c);
  kq::Weights w;
  w.kind = int(kind);
  w.blocks = blocks;
  w.c = c;
  w.codes = static_cast<const uint8_t*>(codes.data_ptr());
  w.sc = static_cast<const uint8_t*>(sc.data_ptr());
  w.d = d.data_ptr<float>();
  if (kind == 4) {
    w.mn = static_cast<const uint8_t*>(mn.data_ptr());
    w.dmin = dmin.data_ptr<float>();
  }
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    kq::gemm_blocks(int(path), w, a, begin, end, yp, blocks * kq::kLanes);
  });
  return y;
}

int64_t kq_supported_paths() { return int64_t(kq::supported_paths()); }
int64_t kq_best_path() { return kq::best_path(); }

std::string kq_path_names() {
  std::string names;
  for (int p = 0; p < kq::kPathCount; ++p) names += (p ? "," : "") + std::string(kq::path_name(p));
  return names;
}

}  // namespace

TORCH_LIBRARY(specbound_kq, m) {
  m.def("gemm(Tensor x, Tensor codes, Tensor sc, Tensor mn, Tensor d, Tensor dmin, int kind, int path) -> Tensor");
  m.def("supported_paths() -> int");
  m.def("best_path() -> int");
  m.def("path_names() -> str");
}

TORCH_LIBRARY_IMPL(specbound_kq, CPU, m) { m.impl("gemm", kq_gemm); }
TORCH_LIBRARY_IMPL(specbound_kq, CompositeExplicitAutograd, m) {
  m.impl("supported_paths", kq_supported_paths);
  m.impl("best_path", kq_best_path);
  m.impl("path_names", kq_path_names);
}
