"""How close is each quantised target to the fp32 one? Teacher-forced top-1 agreement and KL per token.

For held-out prompts of every set, the fp32 target (the packaged GGUF dequantised to float32,
oneDNN-prepacked) writes a greedy continuation; then every variant reads the same token sequence
(prompt + continuation) in one pass, and at every position we compare its next-token law with
fp32's: top-1 agreement (same arg-max) and KL(fp32 ‖ variant) in nats (T = 1, full vocabulary).

Variants: the K-quant target (``--kquant``: the GGUF file's own weights, activations rounded to int8
per 32 inputs; models/kquant.py), int8 torch targets with per-tensor or per-channel weight scales and per-tensor or
per-token activation scales, with the n input channels of largest activation read apart or
SmoothQuant-smoothed (both calibrated on specbound's built-in calibration texts, which share nothing
with the prompt sets), and llama.cpp's Q4_K_M on the packaged GGUF (its own logits, one
batched read — the kernels llama.cpp uses when it verifies a draft).

    python benchmarks/fidelity.py --n-prompts 8 --out docs/results/fidelity
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from specbound.assets.models import DEFAULT_TARGET, gguf_path, load_hf_model
from specbound.assets.prompts import format_prompt, load_prompts
from specbound.models.calibration import calibration_batches
from specbound.models.hf import HFModel
from specbound.models.int8 import activation_absmax, quantize_int8
from specbound.models.loading import load_model
from specbound.runtime import configure_threads

SETS = {"humaneval": 10, "mtbench": 8, "gsm8k": 8}          # held-out offsets (development used the first ones)
VARIANTS = {       # activations 7-bit unless the label says 8-bit (the default where the CPU has VNNI)
    "int8 w:tensor a:tensor (torch default)": dict(weights="tensor", activations="tensor", bits=7),
    "int8 w:channel a:tensor": dict(weights="channel", activations="tensor", bits=7),
    "int8 w:channel a:token": dict(weights="channel", activations="token", bits=7),
    "int8 w:channel a:token, 4 outlier channels apart": dict(weights="channel", activations="token", outliers=4, bits=7),
    "int8 w:channel a:token, 8 outlier channels apart": dict(weights="channel", activations="token", outliers=8, bits=7),
    "int8 w:channel a:token, 16 outlier channels apart": dict(weights="channel", activations="token", outliers=16,
                                                              bits=7),
    "int8 w:channel a:token + smooth 0.5": dict(weights="channel", activations="token", alpha=0.5, bits=7),
    "int8 w:channel a:token 8-bit, 16 outlier channels apart": dict(weights="channel", activations="token",
                                                                    outliers=16, bits=8),
}


def compare(ref_logits: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position: (same arg-max as the reference?, KL(ref ‖ other) in nats)."""
    ref_logp = torch.log_softmax(ref_logits.float(), -1)
    logp = torch.log_softmax(logits.float(), -1)
    agree = ref_logits.argmax(-1) == logits.argmax(-1)
    kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1)
    return agree, kl


def texts(tokenizer, n_prompts: int, sets) -> list[tuple[str, list[int]]]:
    out = []
    for name in sets:
        for p in load_prompts(name, limit=n_prompts, offset=SETS[name]):
            out.append((f"{name}/{p.id}", tokenizer(format_prompt(tokenizer, p), return_tensors="pt").input_ids[0].tolist()))
    return out


def greedy_continuation(model: HFModel, ids: list[int], n: int) -> list[int]:
    model.prefill(ids[:-1])
    out, last = [], ids[-1]
    for _ in range(n):
        last = int(model.forward(torch.tensor([[last]]))[0, -1].argmax())
        out.append(last)
    return out


def read_all(model, ids: list[int]) -> torch.Tensor:
    model.reset()
    return model.forward(torch.tensor([ids]))[0].float()


def summarise(rows) -> dict:
    agree = [a for r in rows for a in r["agree"]]
    kl = [k for r in rows for k in r["kl"]]
    per_prompt_agree = [statistics.fmean(r["agree"]) for r in rows]
    per_prompt_kl = [statistics.fmean(r["kl"]) for r in rows]
    n = len(rows)
    return {
        "positions": len(agree), "prompts": n,
        "top1_agreement": statistics.fmean(agree),
        "top1_agreement_se": statistics.stdev(per_prompt_agree) / math.sqrt(n) if n > 1 else float("nan"),
        "mean_kl": statistics.fmean(kl),
        "mean_kl_se": statistics.stdev(per_prompt_kl) / math.sqrt(n) if n > 1 else float("nan"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--sets", default="humaneval,mtbench,gsm8k")
    ap.add_argument("--continuation", type=int, default=32, help="fp32 greedy tokens appended to each prompt")
    ap.add_argument("--variants", default="all", help="'|'-separated variant names, 'all', or 'none'")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--kquant", action="store_true",
                    help="also the K-quant target (--target-precision kquant: the GGUF's own Q4_K/Q6_K weights)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default="docs/results/fidelity")
    args = ap.parse_args(argv)
    configure_threads(args.threads)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    sets = args.sets.split(",")
    variants = VARIANTS if args.variants == "all" else {} if args.variants == "none" else \
        {k: v for k, v in VARIANTS.items() if k in args.variants.split("|")}
    unknown = set(args.variants.split("|")) - set(VARIANTS) - {"all", "none"}
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; known: {' | '.join(VARIANTS)}")

    t0 = time.perf_counter()
    fp32 = load_model(DEFAULT_TARGET, progress=True, precision="fp32")
    tok = fp32.tokenizer
    items = texts(tok, args.n_prompts, sets)
    seqs, refs = {}, {}
    for i, (name, ids) in enumerate(items):
        seqs[name] = ids + greedy_continuation(fp32, ids, args.continuation)
        refs[name] = read_all(fp32, seqs[name])          # float32: bf16 would round logits by ~0.1
        print(f"[{i + 1}/{len(items)}] fp32 reference {name}: {len(seqs[name])} tokens "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    del fp32
    calib = None                        # activation statistics from the built-in calibration texts
    results = {}

    def evaluate(label, model):
        rows = []
        for name, ids in seqs.items():
            agree, kl = compare(refs[name], read_all(model, ids))
            rows.append({"prompt": name, "agree": agree.tolist(), "kl": kl.tolist()})
        per_set = {s: summarise([r for r in rows if r["prompt"].startswith(s + "/")]) for s in sets}
        results[label] = {"all": summarise(rows), "per_set": per_set}
        print(f"{label}: top-1 {results[label]['all']['top1_agreement']:.4f}  KL {results[label]['all']['mean_kl']:.5f} "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)

    for label, spec in variants.items():
        hf, _ = load_hf_model(DEFAULT_TARGET, progress=False)
        if calib is None and ("alpha" in spec or "outliers" in spec):
            calib = activation_absmax(hf, calibration_batches(tok))
        quantize_int8(hf, weights=spec["weights"], activations=spec["activations"],
                      smooth=calib if "alpha" in spec else None, alpha=spec.get("alpha", 0.5),
                      absmax=calib, outliers=spec.get("outliers", 0), activation_bits=spec["bits"])
        model = HFModel(hf, tok, name=label)
        evaluate(label, model)
        del model, hf
    if args.kquant:
        model = load_model(DEFAULT_TARGET, progress=False, precision="kquant")
        evaluate("kquant: the GGUF's Q4_K/Q6_K weights as stored, int8 activations per 32 inputs", model)
        del model
    if not args.no_llamacpp:
        from specbound.models.llamacpp import LlamaCppModel

        q4 = LlamaCppModel(gguf_path(DEFAULT_TARGET, progress=False), n_ctx=2048, n_batch=512)
        evaluate("llama.cpp Q4_K_M (batched read)", q4)
        q4.close()
    doc = {"reference": "fp32 (packaged GGUF dequantised, oneDNN-prepacked)", "sets": {s: SETS[s] for s in sets},
           "n_prompts": args.n_prompts, "continuation": args.continuation, "results": results,
           "seconds": time.perf_counter() - t0, "torch": torch.__version__}
    (out_dir / "fidelity.json").write_text(json.dumps(doc, indent=1))
    lines = ["| target | " + " | ".join(f"{s} top-1 | {s} KL" for s in sets) + " | all top-1 | all KL (nats) |",
             "|---|" + "---:|---:|" * (len(sets) + 1)]
    for label, r in results.items():
        cells = [f"{r['per_set'][s]['top1_agreement']:.4f} | {r['per_set'][s]['mean_kl']:.4f}" for s in sets]
        a = r["all"]
        lines.append(f"| {label} | " + " | ".join(cells) +
                     f" | {a['top1_agreement']:.4f} ± {a['top1_agreement_se']:.4f} | {a['mean_kl']:.4f} ± {a['mean_kl_se']:.4f} |")
    table = "\n".join(lines)
    print(table)
    (out_dir / "fidelity.md").write_text(
        f"# Fidelity of quantised targets to the fp32 target\n\n`python benchmarks/fidelity.py --n-prompts {args.n_prompts}`"
        f" ({time.strftime('%Y-%m-%d')}, {doc['seconds']:.0f} s). Held-out prompts: "
        + ", ".join(f"{s} from index {SETS[s]}" for s in sets) +
        f"; each prompt + {args.continuation} fp32 greedy tokens, teacher-forced; every position compared "
        "(± = standard error across prompts).\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
