"""`specbound bench --verify-cost`: t(k)/t(1) of the target, eager linear layers vs the prepacked path.

The whole model reads k new tokens after a ~100-token cached context, for k = 1, 2, 4, …, 64; each
timing is the median of repeats. Eager is measured first, then the same model is prepacked in place
(one copy of the weights in memory) and measured again, and the logits of both paths are compared
on the same input. :func:`run_verify_cost` returns the report (the command writes it as JSON and
prints :func:`markdown`); the measured profile feeds :class:`specbound.theory.speedup.CostProfile`.
"""
from __future__ import annotations

import time

import torch

from ..assets.models import DEFAULT_TARGET, load_hf_model
from ..decoding.costs import measure_forward_costs
from ..models.fast import prepack_linears
from ..models.hf import HFModel

KS = (1, 2, 4, 8, 16, 32, 64)
CONTEXT = ("def merge_sort(values):\n    \"\"\"Sort a list of numbers with merge sort and return a new list.\n"
           "    >>> merge_sort([3, 1, 2])\n    [1, 2, 3]\n    \"\"\"\n    if len(values) <= 1:\n        return list(values)\n"
           "    middle = len(values) // 2\n    left = merge_sort(values[:middle])\n    right = merge_sort(values[middle:])\n")


def _profile(model: HFModel, context, ks, repeats) -> tuple[dict[int, float], dict[int, float]]:
    """Median seconds and relative spread ((max − min)/median over the repeats) per k."""
    model.reset()
    model.forward(context)
    measure_forward_costs(model, ks=(1, 8), repeats=1)           # warm-up (page faults, kernel caches)
    profile, spread = measure_forward_costs(model, ks=ks, repeats=repeats)
    return dict(zip(profile.ks, profile.seconds)), dict(zip(profile.ks, spread))


def run_verify_cost(target: str | None = None, ks=KS, repeats: int = 5) -> dict:
    """t(k) of ``target`` (packaged name or directory; default the packaged target), eager then prepacked,
    and how far the two paths' logits differ."""
    raw, tokenizer = load_hf_model(target or DEFAULT_TARGET)
    context = tokenizer(CONTEXT, return_tensors="pt").input_ids
    probe = torch.randint(0, 1000, (1, 8), generator=torch.Generator().manual_seed(0))
    model = HFModel(raw, tokenizer, name=str(target or DEFAULT_TARGET))

    eager, eager_spread = _profile(model, context, ks, repeats)
    model.reset()
    with torch.inference_mode():
        eager_logits = raw(input_ids=torch.cat([context, probe], 1)).logits[0, -8:].clone()
    t0 = time.perf_counter()
    swapped = prepack_linears(raw)
    prepack_seconds = time.perf_counter() - t0
    fast, fast_spread = _profile(model, context, ks, repeats)
    with torch.inference_mode():
        fast_logits = raw(input_ids=torch.cat([context, probe], 1)).logits[0, -8:]
    report = {
        "target": model.name, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "context_tokens": int(context.shape[1]), "repeats": repeats, "prepacked_layers": swapped,
        "prepack_seconds": prepack_seconds,
        "eager_ms": {k: 1000 * v for k, v in eager.items()}, "fast_ms": {k: 1000 * v for k, v in fast.items()},
        "eager_ratio": {k: v / eager[1] for k, v in eager.items()}, "fast_ratio": {k: v / fast[1] for k, v in fast.items()},
        "eager_spread": eager_spread, "fast_spread": fast_spread,
        "max_abs_logit_diff": float((fast_logits - eager_logits).abs().max()),
        "argmax_identical": bool(torch.equal(fast_logits.argmax(-1), eager_logits.argmax(-1))),
    }
    return report


def markdown(report: dict) -> str:
    lines = [f"target `{report['target']}`, fp32, torch {report['torch']}, {report['threads']} threads, "
             f"{report['context_tokens']}-token cached context, median of {report['repeats']}", "",
             "spread = (max − min)/median over the repeats: a large spread means a disturbed machine; re-run",
             "",
             "| k | eager ms (spread) | eager t(k)/t(1) | prepacked ms (spread) | prepacked t(k)/t(1) | prepacked / eager |",
             "|---|---|---|---|---|---|"]
    for k in report["eager_ms"]:
        e, f = report["eager_ms"][k], report["fast_ms"][k]
        lines.append(f"| {k} | {e:.0f} ({report['eager_spread'][k]:.0%}) | {report['eager_ratio'][k]:.2f} | "
                     f"{f:.0f} ({report['fast_spread'][k]:.0%}) | {report['fast_ratio'][k]:.2f} | {f / e:.2f} |")
    lines.append("")
    lines.append(f"max |logit difference| prepacked vs eager on 8 tokens: {report['max_abs_logit_diff']:.2e}; "
                 f"arg-max identical: {report['argmax_identical']}")
    return "\n".join(lines) + "\n"
