"""Where a forward's time goes: t(k) of the kquant (default) and int8 targets and the draft (median of repeats, spread), the
time the weights take to stream, and a per-operator profile (int8 GEMMs, attention, norms, rotary,
mask building, cache updates, the rest = Python and small ops).

    python benchmarks/profile_forward.py --repeats 7 --out docs/results/profile
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specbound.assets.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specbound.models.hf import HFModel
from specbound.models.loading import load_gguf_model, load_model
from specbound.models.static import StaticCacheHFModel
from specbound.runtime import configure_threads

KS = (1, 2, 4, 8, 16, 32)
BUCKETS = (("K-quant GEMM (kquant.cpp)", ("specbound_kq::gemm",)),
           ("int8 GEMM (fbgemm)", ("quantized::linear_dynamic",)),
           ("fp32 GEMM", ("aten::addmm", "aten::mm", "aten::linear", "mkldnn")),
           ("attention", ("scaled_dot_product", "aten::_softmax", "aten::bmm", "aten::baddbmm")),
           ("norms", ("aten::rsqrt", "aten::pow", "aten::mean")),
           ("cache update / copies", ("aten::cat", "aten::copy_", "aten::index_select", "aten::index")),
           ("elementwise", ("aten::mul", "aten::add", "aten::div", "aten::silu", "aten::neg", "aten::abs",
                            "aten::amax", "aten::clamp")))


def weight_bytes(model) -> int:
    """Bytes a forward streams: every int8/fp32 buffer and parameter of the model."""
    seen, total = set(), 0
    for t in list(model.model.parameters()) + list(model.model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    for m in model.model.modules():              # fbgemm's packed weights are opaque: count their int8 values
        if hasattr(m, "_packed"):
            total += m.out_features * m.in_features
    return total


def t_of_k(models: dict, ks, repeats: int, prefix: int = 96) -> dict:
    """Per model: median and (max − min)/median of reading k tokens after a cached prefix; repeats
    interleaved over k and over the models (so a slow moment of the machine hits all of them)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 20000, (prefix,), generator=gen).tolist()
    for model in models.values():
        model.prefill(ids)
    times = {name: {k: [] for k in ks} for name in models}
    for _ in range(repeats + 1):                 # the first sweep warms up
        for k in ks:
            toks = torch.randint(100, 20000, (1, k), generator=gen)
            for name, model in models.items():
                t0 = time.perf_counter()
                model.forward(toks)
                times[name][k].append(time.perf_counter() - t0)
                model.crop(prefix)
    out = {}
    for name, per_k in times.items():
        out[name] = {}
        for k, v in per_k.items():
            v = v[1:]
            med = statistics.median(v)
            out[name][k] = {"median_ms": 1e3 * med, "spread": (max(v) - min(v)) / med}
    return out


def profile(model, k: int, prefix: int = 96) -> dict:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    ids = list(range(100, 100 + prefix))
    model.prefill(ids)
    toks = torch.randint(100, 20000, (1, k))
    for _ in range(2):
        model.forward(toks)
        model.crop(prefix)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            model.forward(toks)
            model.crop(prefix)
    total = 0.0
    buckets = {name: 0.0 for name, _ in BUCKETS}
    for e in prof.key_averages():
        if e.key.startswith("ProfilerStep"):
            continue
        self_us = e.self_cpu_time_total
        total += self_us
        for name, keys in BUCKETS:
            if any(key in e.key for key in keys):
                buckets[name] += self_us
                break
    per_forward = total / 3 / 1e3
    out = {name: v / 3 / 1e3 for name, v in buckets.items()}
    out["other (Python, small ops)"] = per_forward - sum(out.values())
    return {"total_ms": per_forward, "ms": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--bandwidth-gbs", type=float, default=0.0,
                   help="memory bandwidth for the weight-streaming time (default: measured with a large copy)")
    ap.add_argument("--out", default="docs/results/profile")
    args = ap.parse_args(argv)
    configure_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.bandwidth_gbs <= 0:
        a = torch.ones(256 * 2 ** 20 // 4)
        b = torch.empty_like(a)
        seconds = []
        for _ in range(5):
            t0 = time.perf_counter()
            b.copy_(a)
            seconds.append(time.perf_counter() - t0)
        args.bandwidth_gbs = 2 * a.numel() * 4 / min(seconds) / 1e9          # bytes read + written
    models = {"target kquant": load_model(DEFAULT_TARGET, progress=False, precision="kquant"),
              "target int8": load_model(DEFAULT_TARGET, progress=False, precision="int8"),
              "draft int8": load_model(DEFAULT_DRAFT, progress=False, precision="int8")}
    # the same targets read through torch.compile (their own caches; the same logits bit for bit)
    for name in ("target kquant", "target int8"):
        if isinstance(models[name], StaticCacheHFModel):
            compiled = models[name].fork()
            compiled.compiled = True
            compiled.compile_now()
            models[f"{name}, torch.compile"] = compiled
    # the same int8 modules through the model's own forward over a DynamicCache (no static cache)
    for name in ("target int8", "draft int8"):
        if isinstance(models[name], StaticCacheHFModel):
            models[f"{name} (HF forward, DynamicCache)"] = HFModel(models[name].model, name=name)
    try:
        models["draft Q4_K_M (llama.cpp)"] = load_gguf_model(DEFAULT_DRAFT, progress=False)
        models["draft q4_0 (llama.cpp, --draft-quant q4_0)"] = load_gguf_model(DEFAULT_DRAFT, progress=False,
                                                                             quant="q4_0")
        models["target Q4_K_M (llama.cpp)"] = load_gguf_model(DEFAULT_TARGET, progress=False)
    except Exception as exc:  # noqa: BLE001 - llama.cpp is optional here
        print(f"llama.cpp models skipped: {exc}", file=sys.stderr)
    report = {"threads": torch.get_num_threads(), "bandwidth_gbs": args.bandwidth_gbs, "models": {}}
    costs = t_of_k({n: m for n, m in models.items() if "llama.cpp" not in n}, KS, args.repeats)
    costs.update(t_of_k({n: m for n, m in models.items() if "llama.cpp" in n}, KS, args.repeats))
    for name, model in models.items():
        entry = {"costs": costs[name]}
        if hasattr(model, "model"):
            entry["weight_bytes"] = weight_bytes(model)
            entry["stream_ms"] = entry["weight_bytes"] / (args.bandwidth_gbs * 1e9) * 1e3
            entry["profile_k1"] = profile(model, 1)
            entry["profile_k8"] = profile(model, 8)
        report["models"][name] = entry
        print(name, json.dumps(entry["costs"]), file=sys.stderr)
    lines = [f"# Forward costs and where they go ({time.strftime('%Y-%m-%d')}, {report['threads']} threads)", "",
             f"`python benchmarks/profile_forward.py --repeats {args.repeats}`; copy bandwidth "
             f"{args.bandwidth_gbs:.1f} GB/s. t(k): median of {args.repeats} reads of k tokens after a 96-token cached "
             "prefix, (max − min)/median in brackets; torch models' repeats interleaved. The kquant and int8 rows read through "
             "specbound's static KV cache (models/static.py); the row marked \"torch.compile\" reads the same modules "
             "through the compiled layer step (`--compile`, the default for these targets; compiled before timing); the rows marked \"HF forward, "
             "DynamicCache\" are the same int8 modules through the model's own forward.", "",
             "| model | " + " | ".join(f"t({k}) ms" for k in KS) + " | t(8)/t(1) | weights streamed in |", "|---|" + "---:|" * (len(KS) + 2)]
    for name, e in report["models"].items():
        c = e["costs"]
        cells = [f"{c[k]['median_ms']:.1f} ({c[k]['spread']:.0%})" for k in KS]
        stream = f"{e['stream_ms']:.0f} ms ({e['weight_bytes'] / 1e9:.2f} GB)" if "stream_ms" in e else "–"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {c[8]['median_ms'] / c[1]['median_ms']:.2f} | {stream} |")
    for name, e in report["models"].items():
        if "profile_k1" not in e:
            continue
        lines += ["", f"## {name}: operator time per forward (torch.profiler, self time, mean of 3)", "",
                  "| | k = 1 ms | k = 8 ms |", "|---|---:|---:|"]
        for bucket in e["profile_k1"]["ms"]:
            lines.append(f"| {bucket} | {e['profile_k1']['ms'][bucket]:.1f} | {e['profile_k8']['ms'][bucket]:.1f} |")
        lines.append(f"| total (profiled) | {e['profile_k1']['total_ms']:.1f} | {e['profile_k8']['total_ms']:.1f} |")
    text = "\n".join(lines) + "\n"
    (out / "profile.md").write_text(text)
    (out / "profile.json").write_text(json.dumps(report, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
