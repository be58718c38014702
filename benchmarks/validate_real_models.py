"""Real-model validation (minutes, not for CI): on the packaged Qwen pair, greedy speculative decoding
in every engine must reproduce the target's own greedy `generate` token for token, and the KV cache
after a rollback must equal a fresh forward over the committed prefix.

    .venv/bin/python benchmarks/validate_real_models.py [--prompts 3] [--tokens 48]

Prints a table and writes runs/validate-real-models.json. Exits 1 if any check fails.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from specbound.assets.prompts import format_prompt, load_prompts
from specbound.decoding import speculative_decode
from specbound.models.loading import load_model, load_pair

ENGINES = {
    "chain γ=auto": dict(gamma="auto"),
    "chain γ=6": dict(gamma=6),
    "batch M=3 design B": dict(gamma=4, drafts=3, design="B"),
    "tree dynamic P=16": dict(tree=16, tree_drafter="dynamic"),
    "tree oracle P=8": dict(tree=8, tree_drafter="oracle"),
}


def rollback_error(model, ids) -> float:
    """Read the prompt, read 6 junk tokens, crop them, read 3 real tokens: compare with a fresh forward."""
    model.reset()
    model.forward(ids)
    model.forward(torch.randint(0, 1000, (1, 6)))
    model.crop(ids.shape[1])
    nxt = torch.tensor([[11, 22, 33]])
    cached = model.forward(nxt)
    with torch.inference_mode():
        fresh = model.model(input_ids=torch.cat([ids, nxt], 1)).logits[:, -3:]
    return float((cached - fresh).abs().max())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args(argv)
    target, draft_fp32 = load_pair()
    draft = load_model("qwen2.5-coder-0.5b", int8=True)
    rows, ok = [], True
    for prompt in load_prompts("humaneval", limit=args.prompts) + load_prompts("mtbench", limit=1):
        ids = target.tokenizer(format_prompt(target.tokenizer, prompt), return_tensors="pt").input_ids
        with torch.inference_mode():
            ref = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.tokens,
                                        min_new_tokens=args.tokens, do_sample=False,
                                        pad_token_id=target.tokenizer.eos_token_id)[0, ids.shape[1]:].tolist()
        for name, kwargs in ENGINES.items():
            t0 = time.perf_counter()
            out = speculative_decode(target, draft, ids, args.tokens, temperature=0.0, **kwargs)
            same = out.tokens == ref
            ok &= same
            rows.append({"prompt": prompt.id, "engine": name, "identical": same, "tau": out.metrics.tau,
                         "seconds": time.perf_counter() - t0})
            print(f"{prompt.id:14s} {name:20s} identical={same} τ={out.metrics.tau:.2f}", flush=True)
    errors = {"target": rollback_error(target, ids), "draft fp32": rollback_error(draft_fp32, ids)}
    ok &= all(e < 1e-3 for e in errors.values())
    print("rollback max |logit diff| vs fresh forward:", errors)
    Path("runs").mkdir(exist_ok=True)
    Path("runs/validate-real-models.json").write_text(json.dumps({"rows": rows, "rollback": errors, "ok": ok}, indent=2))
    print("ALL CHECKS PASSED" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
