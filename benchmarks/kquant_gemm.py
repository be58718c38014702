"""The weight GEMMs of one target pass, side by side: the K-quant kernel over the packaged GGUF's own
Q4_K/Q6_K tensors (models/kquant.py) against fbgemm over the int8 target's tensors, for k tokens per
pass. Only the GEMMs (every linear layer and the output head, weights streamed from memory once per
pass as in decoding); norms, attention and Python are not in it. Repeats are interleaved (k, then
the two kernels), the first sweep is a warm-up; median and min–max per cell.

    python benchmarks/kquant_gemm.py --repeats 7 --out docs/results/kquant-gemm
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

from specbound.assets.gguf import gguf_path
from specbound.assets.models import DEFAULT_TARGET
from specbound.models.int8 import Int8Linear
from specbound.models.kquant import KQuantLinear, pack_q4_k, pack_q6_k
from specbound.models.loading import load_model
from specbound.runtime import configure_threads

KS = (1, 2, 4, 8, 12, 16)


def kquant_layers() -> list[KQuantLinear]:
    import gguf

    reader = gguf.GGUFReader(str(gguf_path(DEFAULT_TARGET, progress=False)))
    layers = []
    for t in reader.tensors:
        if t.tensor_type.name == "Q4_K":
            layers.append(KQuantLinear(pack_q4_k(t.data)))
        elif t.tensor_type.name == "Q6_K":
            layers.append(KQuantLinear(pack_q6_k(t.data)))
    return layers


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    configure_threads(args.threads)
    warnings.simplefilter("ignore")
    kq = kquant_layers()
    int8 = [m for m in load_model(DEFAULT_TARGET, progress=False, precision="int8").model.modules()
            if isinstance(m, Int8Linear)]
    kq_bytes = sum(m.weight_bytes() for m in kq)
    int8_bytes = sum(m.out_features * (m.in_features + 4) for m in int8)      # int8 values + per-row scales
    gen = torch.Generator().manual_seed(0)
    inputs = {k: ([torch.randn(k, m.in_features, generator=gen) for m in kq],
                  # fbgemm reads the main column group plus the anchor row (models/int8.py)
                  [torch.randn(k + 1, m.qweight.shape[1], generator=gen) for m in int8]) for k in KS}

    def run_kquant(k):
        for m, x in zip(kq, inputs[k][0]):
            m(x)

    def run_fbgemm(k):
        for m, x in zip(int8, inputs[k][1]):
            torch.ops.quantized.linear_dynamic(x, m._packed, m.reduce_range)

    times = {name: {k: [] for k in KS} for name in ("kquant", "fbgemm")}
    with torch.inference_mode():
        for _ in range(args.repeats + 1):
            for k in KS:
                for name, fn in (("kquant", run_kquant), ("fbgemm", run_fbgemm)):
                    t0 = time.perf_counter()
                    fn(k)
                    times[name][k].append(time.perf_counter() - t0)
    rows = []
    for k in KS:
        row = {"k": k}
        for name in times:
            v = [1e3 * t for t in times[name][k][1:]]
            row[name] = {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v)}
        row["ratio"] = row["kquant"]["median_ms"] / row["fbgemm"]["median_ms"]
        rows.append(row)
    lines = [f"# The weight GEMMs of one target pass: K-quant kernel vs fbgemm int8",
             "", f"`python benchmarks/kquant_gemm.py --repeats {args.repeats}` ({args.threads} threads). "
             f"K-quant: the packaged GGUF's {len(kq)} Q4_K/Q6_K tensors as stored, {kq_bytes / 1e9:.2f} GB; "
             f"fbgemm: the int8 target's {len(int8)} int8 linears (fused q/k/v and gate/up), "
             f"{int8_bytes / 1e9:.2f} GB. Median (min–max) of {args.repeats} interleaved repeats, ms.", "",
             "| k | K-quant | fbgemm int8 | ratio |", "|---:|---:|---:|---:|"]
    for r in rows:
        a, b = r["kquant"], r["fbgemm"]
        lines.append(f"| {r['k']} | {a['median_ms']:.1f} ({a['min_ms']:.1f}–{a['max_ms']:.1f}) | "
                     f"{b['median_ms']:.1f} ({b['min_ms']:.1f}–{b['max_ms']:.1f}) | {r['ratio']:.2f} |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "kquant-gemm.md").write_text(text, encoding="utf-8")
        (out / "kquant-gemm.json").write_text(json.dumps({"repeats": args.repeats, "threads": args.threads,
                                                          "kquant_bytes": kq_bytes, "int8_bytes": int8_bytes,
                                                          "rows": rows}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
