"""The K-quant kernel's paths side by side on this CPU: whole reads of the packaged target t(k) and its
weight GEMMs on every path the CPU runs, and the int8 multiply-add peak of each path's instructions.

One process, one target (the packaged Q4_K_M GGUF's own Q4_K/Q6_K weights, static KV cache, eager
reads: the path is switched between repeats on the same layers, so every path reads the same bytes),
repeats interleaved over k and paths, the first sweep a warm-up; median and min-max. The portable path
is ~10x slower and gets fewer repeats. The peak: register-only loops of the path's product instruction
(AVX-512 VNNI: vpdpbusd zmm, 64 multiply-adds; AVX-VNNI: VEX vpdpbusd ymm, 32; AVX2: vpmaddubsw ymm,
32, plus the vpaddw that sums its pairs), independent accumulators, every thread: no int8 kernel on that
path can exceed it, which says where the CPU, not the code, sets a path's t(8).

    python benchmarks/kquant_paths.py --repeats 7 --out docs/results/kquant-paths
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

from specbound.assets.models import DEFAULT_TARGET
from specbound.models.kquant import KQuantLinear, path_id, supported_paths
from specbound.models.loading import load_model
from specbound.runtime import configure_threads

KS = (1, 2, 4, 8)
PORTABLE_KS = (1, 8)

PEAK_SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <cstdint>
template <class Body> double rate(int64_t iterations, int64_t threads, double macs_per_iteration, Body body) {
  double seconds = 0.0;
  #pragma omp parallel num_threads(threads)
  {
    #pragma omp barrier
    const double t0 = omp_get_wtime();
    body(iterations);
    const double t = omp_get_wtime() - t0;
    #pragma omp critical
    { if (t > seconds) seconds = t; }
  }
  return double(iterations) * macs_per_iteration * double(threads) / seconds;
}
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void zmm_loop(int64_t n) {
  __m512i acc[24]; const __m512i w = _mm512_set1_epi8(3);
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_epi32(i);
  for (int64_t it = 0; it < n; ++it)
    for (int i = 0; i < 24; ++i) asm volatile("vpdpbusd %1, %1, %0" : "+v"(acc[i]) : "v"(w));
  asm volatile("" :: "v"(acc[0]), "v"(acc[23]));
}
__attribute__((target("avx2,avxvnni"))) void ymm_vnni_loop(int64_t n) {
  __m256i acc[14]; const __m256i w = _mm256_set1_epi8(3);
  for (int i = 0; i < 14; ++i) acc[i] = _mm256_set1_epi32(i);
  for (int64_t it = 0; it < n; ++it)
    for (int i = 0; i < 14; ++i) asm volatile("%{vex%} vpdpbusd %1, %1, %0" : "+x"(acc[i]) : "x"(w));
  asm volatile("" :: "x"(acc[0]), "x"(acc[13]));
}
__attribute__((target("avx2"))) void ymm_maddubs_loop(int64_t n) {
  __m256i acc[12]; const __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(1);
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi16(i);
  for (int64_t it = 0; it < n; ++it)
    for (int i = 0; i < 12; ++i) {
      __m256i p;
      asm volatile("vpmaddubsw %2, %1, %0" : "=x"(p) : "x"(w), "x"(x));
      asm volatile("vpaddw %1, %0, %0" : "+x"(acc[i]) : "x"(p));
    }
  asm volatile("" :: "x"(acc[0]), "x"(acc[11]));
}
double int8_peak(int64_t path, int64_t iterations, int64_t threads) {
  if (path == 3) return rate(iterations, threads, 24.0 * 64, zmm_loop);
  if (path == 2) return rate(iterations, threads, 14.0 * 32, ymm_vnni_loop);
  return rate(iterations, threads, 12.0 * 32, ymm_maddubs_loop);
}
"""
PEAK_PATHS = {"avx512vnni": 3, "avxvnni": 2, "avx2": 1}


def peaks(paths, threads: int, repeats: int) -> dict[str, list[float]]:
    from torch.utils.cpp_extension import load_inline

    module = load_inline(name="specbound_kquant_paths_peak", cpp_sources=[PEAK_SOURCE], functions=["int8_peak"],
                         extra_cflags=["-O2", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)
    out = {}
    for path in paths:
        if path in PEAK_PATHS:
            module.int8_peak(PEAK_PATHS[path], 1000, threads)
            out[path] = [module.int8_peak(PEAK_PATHS[path], 10_000_000 // threads, threads) for _ in range(repeats)]
    return out


def set_path(layers, path: str) -> None:
    number = path_id(path)
    for layer in layers:
        layer.kernel, layer.kernel_number = path, number


def whole_reads(model, layers, paths, repeats: int, prefix: int = 96) -> dict:
    gen = torch.Generator().manual_seed(0)
    model.prefill(torch.randint(100, 20000, (prefix,), generator=gen).tolist())
    times = {p: {k: [] for k in (PORTABLE_KS if p == "portable" else KS)} for p in paths}
    for r in range(repeats + 1):
        for k in KS:
            toks = torch.randint(100, 20000, (1, k), generator=gen)
            for p in paths:
                if k not in times[p] or (p == "portable" and r > max(2, repeats // 3)):
                    continue
                set_path(layers, p)
                t0 = time.perf_counter()
                model.forward(toks)
                if r:
                    times[p][k].append(time.perf_counter() - t0)
                model.crop(prefix)
    return times


def gemm_reads(layers, paths, repeats: int) -> tuple[dict, int]:
    """Seconds of every weight GEMM of one pass (each K-quant layer once) at k = 1 and 8."""
    macs = sum(m.out_features * m.in_features for m in layers)
    gen = torch.Generator().manual_seed(1)
    inputs = {k: [torch.randn(k, m.in_features, generator=gen) for m in layers] for k in (1, 8)}
    times = {p: {1: [], 8: []} for p in paths if p != "portable"}
    for r in range(repeats + 1):
        for k in (1, 8):
            for p in times:
                set_path(layers, p)
                t0 = time.perf_counter()
                for m, x in zip(layers, inputs[k]):
                    m(x)
                if r:
                    times[p][k].append(time.perf_counter() - t0)
    return times, macs


def cell(values) -> str:
    return f"{1e3 * statistics.median(values):.1f} ({1e3 * min(values):.1f}–{1e3 * max(values):.1f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="docs/results/kquant-paths")
    args = ap.parse_args(argv)
    configure_threads(args.threads)
    warnings.simplefilter("ignore")
    paths = [p for p in ("avx512vnni", "avxvnni", "avx2", "neon-i8mm", "neon", "portable") if p in supported_paths()]
    model = load_model(DEFAULT_TARGET, progress=False, precision="kquant")
    layers = [m for m in model.model.modules() if isinstance(m, KQuantLinear)]
    with torch.inference_mode():
        whole = whole_reads(model, layers, paths, args.repeats)
        gemms, macs = gemm_reads(layers, paths, args.repeats)
    peak = peaks(paths, args.threads, args.repeats)
    best = paths[0]
    base = {k: statistics.median(v) for k, v in whole[best].items()}
    import platform

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    lines = [f"# The K-quant kernel's paths on one CPU ({time.strftime('%Y-%m-%d')}, {cpu}, {args.threads} threads)", "",
             f"`python benchmarks/kquant_paths.py --repeats {args.repeats}` — the packaged Q4_K_M target's own weights, "
             "eager reads of k tokens after a 96-token cached prefix, every path on the same layers, repeats "
             f"interleaved; median (min–max) ms. Every path gives the same bits (tests/test_kquant_paths.py).", "",
             "| path | " + " | ".join(f"t({k})" for k in KS) + f" | t(1) / {best} t(1) | t(4) / {best} t(1) | "
             f"t(8) / {best} t(8) |", "|---|" + "---:|" * (len(KS) + 3)]
    for p in paths:
        med = {k: statistics.median(v) for k, v in whole[p].items()}
        cells = [cell(whole[p][k]) if k in whole[p] else "–" for k in KS]
        lines.append(f"| {p} | " + " | ".join(cells) + f" | {med[1] / base[1]:.2f} | "
                     + (f"{med[4] / base[1]:.2f}" if 4 in med else "–") + f" | {med[8] / base[8]:.2f} |")
    lines += ["", f"The weight GEMMs alone ({macs / 1e9:.3f} G multiply-adds per token) and the int8 peak of each "
              "path's product instruction (registers only, every thread):", "",
              "| path | GEMMs k = 1 ms | GEMMs k = 8 ms | k = 8 rate | instruction peak | k = 8 at the peak |",
              "|---|---:|---:|---:|---:|---:|"]
    for p, t in gemms.items():
        rate = 8 * macs / statistics.median(t[8])
        pk = statistics.median(peak[p]) if p in peak else None
        lines.append(f"| {p} | {cell(t[1])} | {cell(t[8])} | {rate / 1e9:.0f} GMAC/s | "
                     + (f"{pk / 1e9:.0f} GMAC/s ({min(peak[p]) / 1e9:.0f}–{max(peak[p]) / 1e9:.0f}) | "
                        f"{1e3 * 8 * macs / pk:.1f} ms |" if pk else "– | – |"))
    report = {"cpu": cpu, "threads": args.threads, "repeats": args.repeats, "macs_per_token": macs,
              "whole": {p: {str(k): v for k, v in t.items()} for p, t in whole.items()},
              "gemms": {p: {str(k): v for k, v in t.items()} for p, t in gemms.items()}, "peaks": peak}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kquant-paths.md").write_text("\n".join(lines) + "\n")
    (out / "kquant-paths.json").write_text(json.dumps(report, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
