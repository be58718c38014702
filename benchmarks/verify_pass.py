"""Why is the verify pass (k new tokens in one target forward) slower than one decode step, and what
fixes it? Measures the packaged Qwen2.5-Coder-1.5B target (fp32) three ways, side by side in one
process, with repeats and spread:

* eager ``nn.Linear`` (PyTorch's default CPU GEMM),
* the previous prepacked path (weight ``to_mkldnn``, activations converted on every call),
* the current prepacked path (weight reordered once for a 16-row GEMM, oneDNN pointwise linear on
  plain tensors; :class:`specbound.models.fast.PrepackedLinear`),

first per linear shape of the model (micro-benchmarks), then the whole model reading k tokens after a
cached context, and a profiler breakdown (top operators) of the current path at k = 1 and k = 8.

    .venv/bin/python benchmarks/verify_pass.py [--repeats 7] [--threads 2] [--out docs/results]

Prints markdown tables and writes <out>/verify-pass.json and <out>/verify-pass.md.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

KS = (1, 2, 4, 8, 16, 32, 64)


class OldPrepackedLinear(nn.Module):
    """The previous kernel (kept here only to measure it): weight ``to_mkldnn``, activations
    converted to and from oneDNN layout on every call."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.out_features = linear.out_features
        self.w = linear.weight.detach().float().to_mkldnn()
        bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(self.out_features)
        self.b = bias.to_mkldnn()

    def forward(self, x):
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1]).float().contiguous()
        y = torch._C._nn.mkldnn_linear(flat.to_mkldnn(), self.w, self.b).to_dense()
        return y.reshape(*lead, self.out_features)


def _stats(times: list[float]) -> dict:
    med = statistics.median(times)
    return {"median_ms": 1e3 * med, "min_ms": 1e3 * min(times), "max_ms": 1e3 * max(times),
            "spread": (max(times) - min(times)) / med, "repeats": len(times)}


def _time(fn, repeats: int, warmup: int = 2) -> dict:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return _stats(times)


def linear_shapes(repeats: int) -> dict:
    from specbound.models.fast import PrepackedLinear

    out = {}
    with torch.inference_mode():
        for fan_in, fan_out in ((1536, 8960), (8960, 1536), (1536, 1536), (1536, 256), (1536, 151936)):
            layer = nn.Linear(fan_in, fan_out, bias=False)
            variants = {"eager": layer, "old prepacked": OldPrepackedLinear(layer), "prepacked": PrepackedLinear(layer)}
            row = {}
            for name, module in variants.items():
                row[name] = {k: _time(lambda m=module, x=torch.randn(1, k, fan_in): m(x), repeats) for k in KS}
            out[f"{fan_in}->{fan_out}"] = row
            del variants, layer
            gc.collect()
    return out


def whole_model(variant: str, repeats: int, context: int = 88) -> dict:
    from specbound.assets.models import DEFAULT_TARGET, load_hf_model
    from specbound.models.fast import PrepackedLinear
    from specbound.models.hf import HFModel

    model, _ = load_hf_model(DEFAULT_TARGET, progress=False)
    if variant != "eager":
        cls = PrepackedLinear if variant == "prepacked" else OldPrepackedLinear
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, cls(child))
    wrapped = HFModel(model)
    ids = torch.randint(100, 20000, (1, context), generator=torch.Generator().manual_seed(0))
    wrapped.prefill(ids[0].tolist())
    base = wrapped.cache_length
    result = {}

    def read(k):
        wrapped.forward(torch.randint(100, 20000, (1, k)))
        wrapped.crop(base)

    for k in KS:
        result[k] = _time(lambda: read(k), repeats)
    profile = {}
    if variant == "prepacked":
        for k in (1, 8):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                read(k)
            rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
            profile[k] = [{"op": e.key, "self_ms": e.self_cpu_time_total / 1e3, "calls": e.count} for e in rows]
    del wrapped, model
    gc.collect()
    return {"t": result, "profile": profile}


def markdown(report: dict) -> str:
    lines = [f"# Verify-pass cost on this CPU ({report['threads']} threads, {report['machine']})", "",
             "Command: `" + report["command"] + "`", "",
             "## Whole Qwen2.5-Coder-1.5B (fp32), k new tokens after an 88-token cached context",
             "", "median ms [min–max] over repeats; ratio = t(k)/t(1) of the same variant", "",
             "| variant | " + " | ".join(f"k={k}" for k in KS) + " | t(8)/t(1) |",
             "|---|" + "---|" * (len(KS) + 1)]
    for name, row in report["whole_model"].items():
        t = row["t"]
        cells = [f"{t[k]['median_ms']:.0f} [{t[k]['min_ms']:.0f}–{t[k]['max_ms']:.0f}]" for k in KS]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {t[8]['median_ms'] / t[1]['median_ms']:.2f} |")
    lines += ["", "## Single linear layers (median ms)", "",
              "| shape | variant | " + " | ".join(f"k={k}" for k in KS) + " |", "|---|---|" + "---|" * len(KS)]
    for shape, row in report["linears"].items():
        for name, t in row.items():
            lines.append(f"| {shape} | {name} | " + " | ".join(f"{t[k]['median_ms']:.2f}" for k in KS) + " |")
    prof = report["whole_model"].get("prepacked", {}).get("profile", {})
    for k, rows in prof.items():
        lines += ["", f"## Top operators, prepacked, k={k} (self CPU ms)", "", "| op | self ms | calls |", "|---|---|---|"]
        lines += [f"| `{r['op']}` | {r['self_ms']:.1f} | {r['calls']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="docs/results")
    parser.add_argument("--variants", default="eager,old prepacked,prepacked")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    report = {"threads": args.threads, "machine": f"{platform.machine()}, torch {torch.__version__}",
              "command": "python benchmarks/verify_pass.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "linears": linear_shapes(args.repeats), "whole_model": {}}
    for variant in args.variants.split(","):
        print(f"whole model: {variant}", flush=True)
        report["whole_model"][variant] = whole_model(variant, args.repeats)
    (out / "verify-pass.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (out / "verify-pass.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
