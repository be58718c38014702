"""How flat can a verify pass be on this CPU? The machine's int8 multiply-add peak against the K-quant
target's weight GEMMs.

A pass over k tokens must (a) stream the weights once and (b) do k multiply-adds per weight. At k = 1 (a)
dominates; at k = 8 (b) may. This script measures

* the peak rate of the widest int8 dot-product instruction this CPU has (AVX-512 VNNI ``vpdpbusd`` on
  512-bit registers: 64 multiply-adds each), in a loop of independent register-only accumulations on
  every thread — no memory traffic, nothing else issued: no int8 kernel can exceed it;
* the target's weight GEMMs (``models/kquant.py``, the packaged Q4_K_M file's tensors as stored) at k =
  1 and k = 8 tokens, interleaved repeats;

and prints the floor on the GEMMs' t(8)/t(1): 8 · (multiply-adds per token) / peak, over the measured
k = 1 time (which streams the weights once). A kernel that reached the instruction peak at k = 8 and
streamed the weights at k = 1 as fast as now would still have at least this ratio.

    python benchmarks/int8_peak.py --repeats 9 --out docs/results/int8-peak
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

from specbound.runtime import configure_threads

PEAK_SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <cstdint>
// vpdpbusd on 512-bit registers, 16 independent accumulators per thread (enough to cover the latency),
// register operands only. Returns multiply-adds per second over all threads.
__attribute__((target("avx512f,avx512bw,avx512vnni")))
double vnni_peak(int64_t iterations, int64_t threads) {
  double seconds = 0.0;
  int64_t checksum = 0;
  #pragma omp parallel num_threads(threads) reduction(+:checksum)
  {
    __m512i acc[16];
    const __m512i w = _mm512_set1_epi8(3);
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_epi32(i);
    #pragma omp barrier
    const double t0 = omp_get_wtime();
    for (int64_t it = 0; it < iterations; ++it)
      for (int i = 0; i < 16; ++i) asm volatile("vpdpbusd %1, %1, %0" : "+v"(acc[i]) : "v"(w));
    const double t = omp_get_wtime() - t0;
    #pragma omp critical
    { if (t > seconds) seconds = t; }
    for (int i = 0; i < 16; ++i) checksum += _mm512_reduce_add_epi32(acc[i]);
  }
  if (checksum == 42) seconds += 1e-12;    // keep the accumulators alive
  return double(iterations) * 16.0 * 64.0 * double(threads) / seconds;
}
"""


def vnni_available() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_vnni" in flags or " avx512vnni" in flags


def peak_rate(threads: int, repeats: int) -> list[float]:
    """Multiply-adds per second of the instruction loop, one value per repeat (each ~0.5 s)."""
    from torch.utils.cpp_extension import load_inline

    module = load_inline(name="specbound_int8_peak", cpp_sources=[PEAK_SOURCE + "\n"],
                         functions=["vnni_peak"], extra_cflags=["-O2", "-fopenmp"], extra_ldflags=["-fopenmp"],
                         verbose=False)
    module.vnni_peak(1000, threads)                                   # warm-up
    return [module.vnni_peak(20_000_000 // max(threads, 1), threads) for _ in range(repeats)]


def gemm_times(repeats: int) -> tuple[dict[int, list[float]], int]:
    """Seconds of every weight GEMM of one target pass at k = 1 and 8 (interleaved), and the
    multiply-adds per token (rows × columns summed over the tensors)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kquant_gemm import kquant_layers

    layers = kquant_layers()
    macs = sum(int(m.out_features) * int(m.in_features) for m in layers)
    gen = torch.Generator().manual_seed(0)
    inputs = {k: [torch.randn(k, m.in_features, generator=gen) for m in layers] for k in (1, 8)}
    times = {1: [], 8: []}
    with torch.inference_mode():
        for r in range(repeats + 1):
            for k in (1, 8):
                t0 = time.perf_counter()
                for m, x in zip(layers, inputs[k]):
                    m(x)
                if r:                                                  # the first sweep warms up
                    times[k].append(time.perf_counter() - t0)
    return times, macs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be >= 1")
    if not vnni_available():
        print("this CPU has no AVX-512 VNNI, and this script measures that path's peak only "
              "(benchmarks/kquant_paths.py measures every path this CPU runs)", file=sys.stderr)
        return 2
    configure_threads(args.threads)
    warnings.simplefilter("ignore")
    peaks = peak_rate(args.threads, args.repeats)
    times, macs = gemm_times(args.repeats)
    peak = statistics.median(peaks)
    t1, t8 = statistics.median(times[1]), statistics.median(times[8])
    floor8 = 8 * macs / peak
    row = {"threads": args.threads, "repeats": args.repeats, "macs_per_token": macs,
           "peak_gmac_s": peak / 1e9, "peak_range_gmac_s": [min(peaks) / 1e9, max(peaks) / 1e9],
           "gemm_ms": {str(k): {"median": 1e3 * statistics.median(v), "min": 1e3 * min(v), "max": 1e3 * max(v)}
                       for k, v in times.items()},
           "gemm_rate_k8_gmac_s": 8 * macs / t8 / 1e9, "k8_at_peak_ms": 1e3 * floor8,
           "ratio_measured": t8 / t1, "ratio_floor": floor8 / t1}
    lines = ["# How flat can a verify pass be here: the int8 multiply-add peak against the target's GEMMs", "",
             f"`python benchmarks/int8_peak.py --repeats {args.repeats} --threads {args.threads}`. Median (min–max) "
             f"of {args.repeats} repeats.", "",
             "| quantity | value |", "|---|---:|",
             f"| int8 multiply-add peak (vpdpbusd zmm, registers only, {args.threads} threads) | "
             f"{peak / 1e9:.0f} GMAC/s ({min(peaks) / 1e9:.0f}–{max(peaks) / 1e9:.0f}) |",
             f"| target weights' multiply-adds per token | {macs / 1e9:.3f} G |",
             f"| GEMMs at k = 1 (weights streamed once) | {1e3 * t1:.1f} ms ({1e3 * min(times[1]):.1f}–"
             f"{1e3 * max(times[1]):.1f}) |",
             f"| GEMMs at k = 8 | {1e3 * t8:.1f} ms ({1e3 * min(times[8]):.1f}–{1e3 * max(times[8]):.1f}), "
             f"{8 * macs / t8 / 1e9:.0f} GMAC/s = {8 * macs / t8 / peak:.0%} of peak |",
             f"| k = 8's multiply-adds at the peak | {1e3 * floor8:.1f} ms |",
             f"| GEMMs' t(8)/t(1), measured | {t8 / t1:.2f} |",
             f"| floor on it (k = 8 at the peak / k = 1 as measured) | **{floor8 / t1:.2f}** |", ""]
    text = "\n".join(lines)
    sys.stdout.write(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "int8-peak.md").write_text(text, encoding="utf-8")
        (out / "int8-peak.json").write_text(json.dumps(row, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
