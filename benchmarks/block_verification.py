"""Block vs token-wise verification on the real pair at T > 0: paired runs (same prompt, same seed,
same drafter setting, interleaved), accepted tokens per round, τ and decode tok/s, with standard
errors of the paired differences. Held-out prompts.

    python benchmarks/block_verification.py --prompt-set humaneval --offset 10 --n-prompts 8 --seeds 3 \
        --out docs/results/block-verification

Target: the int8 torch target; draft: the draft's GGUF on llama.cpp when installed (generate's
default), else the int8 torch draft. Prints a table and writes JSON + markdown. A benchmark: it
asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from specbound.runtime import configure_process

configure_process()

import numpy as np  # noqa: E402

from specbound.assets.prompts import format_prompt, load_prompts  # noqa: E402
from specbound.decoding import engine as engine_module  # noqa: E402
from specbound.decoding import speculative_decode  # noqa: E402
from specbound.theory.verification import block_stop_probabilities, token_stop_probabilities  # noqa: E402
from specbound.models.loading import load_pair  # noqa: E402
from specbound.runtime import configure_threads  # noqa: E402


def _mean_se(values):
    values = [v for v in values if math.isfinite(v)]
    if len(values) < 2:
        return (values[0] if values else float("nan")), float("nan")
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


class SameBlockValues:
    """Wraps the engine's ``verify``: for every sampled drafted chain it verifies, records the exact
    expected accepted tokens of BOTH rules given that very block and the two models' laws along it
    (theory/verification.py), then verifies as asked. Comparing the rules on the same drafts removes
    the sampling noise of two separate runs."""

    def __init__(self):
        self.real, self.rounds = engine_module.verify, []

    def __call__(self, tree, target_probs, law_mask=None, rule=None, generator=None):
        if tree.sampled and tree.is_chain() and len(tree) > 1 and (law_mask is None or bool(law_mask.all())):
            k = len(tree)
            target = target_probs[:k + 1].double().numpy()
            draft = tree.draft_probs[:k].double().numpy()
            tokens = tree.tokens.numpy()
            lengths = np.arange(k + 1)
            token = float(token_stop_probabilities(target=target, draft=draft, tokens=tokens) @ lengths)
            block = float(block_stop_probabilities(target=target, draft=draft, tokens=tokens)[1] @ lengths)
            self.rounds.append((k, token, block))
        return self.real(tree, target_probs, law_mask, rule, generator)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-set", default="humaneval")
    ap.add_argument("--offset", type=int, default=10)
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--gammas", default="4,auto")
    ap.add_argument("--out", default="docs/results/block-verification")
    args = ap.parse_args(argv)
    configure_threads(0)
    gammas = [g if g == "auto" else int(g) for g in args.gammas.split(",")]
    target, draft = load_pair(progress=False, target_precision="int8", draft_engine="auto")
    prompts = load_prompts(args.prompt_set, limit=args.n_prompts, offset=args.offset)
    warm = target.tokenizer("def f(x):\n", return_tensors="pt").input_ids
    speculative_decode(target, draft, warm, 8, gamma="auto", temperature=args.temperature, top_k=args.top_k)
    rows = []
    same = SameBlockValues()
    engine_module.verify = same
    t0 = time.perf_counter()
    for p_index, prompt in enumerate(prompts):
        ids = target.tokenizer(format_prompt(target.tokenizer, prompt), return_tensors="pt").input_ids
        for seed in range(args.seeds):
            for gamma in gammas:
                order = ("token", "block") if (p_index + seed) % 2 == 0 else ("block", "token")
                for rule in order:
                    first = len(same.rounds)
                    m = speculative_decode(target, draft, ids, args.tokens, gamma=gamma, temperature=args.temperature,
                                           top_k=args.top_k, seed=1000 * p_index + seed, verification=rule).metrics
                    rounds = max(len(m.accepted_per_step), 1)
                    rows.append({"prompt": prompt.id, "seed": seed, "gamma": str(gamma), "verification": rule,
                                 "tau": m.tau, "accepted_per_round": sum(m.accepted_per_step) / rounds,
                                 "drafted_per_round": sum(m.drafted_per_step) / rounds,
                                 "decode_tokens_per_second": m.decode_tokens_per_second,
                                 "same_block": same.rounds[first:]})
        print(f"{prompt.id} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    lines = [f"# Block vs token-wise verification ({time.strftime('%Y-%m-%d')})", "",
             f"`python benchmarks/block_verification.py --prompt-set {args.prompt_set} --offset {args.offset} "
             f"--n-prompts {args.n_prompts} --seeds {args.seeds} --tokens {args.tokens} --gammas {args.gammas}`", "",
             f"Target {target.name} ({target.info.kernels}); draft {draft.name} ({draft.info.kernels}); "
             f"T = {args.temperature}, top-k {args.top_k}; {args.tokens} new tokens; {len(prompts)} held-out prompts × "
             f"{args.seeds} seeds, each (prompt, seed, γ) decoded with both rules back to back (order alternating). "
             "Paired ratios block/token per run: mean ± standard error over runs.", "",
             "| γ | τ token | τ block | τ block/token | accepted/round token | block | tok/s block/token |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    summary = {}
    for gamma in map(str, gammas):
        pairs = {}
        for r in rows:
            if r["gamma"] == gamma:
                pairs.setdefault((r["prompt"], r["seed"]), {})[r["verification"]] = r
        done = [v for v in pairs.values() if len(v) == 2]
        tau = {rule: _mean_se([v[rule]["tau"] for v in done]) for rule in ("token", "block")}
        acc = {rule: _mean_se([v[rule]["accepted_per_round"] for v in done]) for rule in ("token", "block")}
        tau_ratio = _mean_se([v["block"]["tau"] / v["token"]["tau"] for v in done])
        speed_ratio = _mean_se([v["block"]["decode_tokens_per_second"] / v["token"]["decode_tokens_per_second"]
                                for v in done])
        summary[gamma] = {"pairs": len(done), "tau": tau, "accepted_per_round": acc, "tau_ratio": tau_ratio,
                          "speed_ratio": speed_ratio}
        lines.append(f"| {gamma} | {tau['token'][0]:.2f} ± {tau['token'][1]:.2f} | {tau['block'][0]:.2f} ± "
                     f"{tau['block'][1]:.2f} | {tau_ratio[0]:.3f} ± {tau_ratio[1]:.3f} | {acc['token'][0]:.2f} | "
                     f"{acc['block'][0]:.2f} | {speed_ratio[0]:.3f} ± {speed_ratio[1]:.3f} |")
    lines += ["", "Same drafted blocks, exact values: for every sampled chain of ≥ 2 tokens verified in these runs, "
              "the expected accepted tokens of each rule given that block and the two models' laws along it "
              "(theory/verification.py). Mean over blocks ± standard error; gain = block/token − 1 of the means.", "",
              "| γ | blocks | mean drafted | E[accepted] token | E[accepted] block | gain |", "|---|---:|---:|---:|---:|---:|"]
    for gamma in map(str, gammas):
        blocks = [b for r in rows if r["gamma"] == gamma for b in r["same_block"]]
        if not blocks:
            continue
        tok, blk = _mean_se([b[1] for b in blocks]), _mean_se([b[2] for b in blocks])
        diff = _mean_se([b[2] - b[1] for b in blocks])
        summary[gamma]["same_block"] = {"blocks": len(blocks), "token": tok, "block": blk, "difference": diff}
        lines.append(f"| {gamma} | {len(blocks)} | {statistics.fmean(b[0] for b in blocks):.2f} | {tok[0]:.3f} | "
                     f"{blk[0]:.3f} | {blk[0] / tok[0] - 1:+.1%} (difference {diff[0]:.3f} ± {diff[1]:.3f}) |")
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"block-{args.prompt_set}.md").write_text(text)
    (out / f"block-{args.prompt_set}.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
