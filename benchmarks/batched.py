"""Batched requests on the real pair: total tokens/s and per-request latency of speculative decoding
against plain batched decoding on the SAME target, per batch size B, with the theory's prediction.

    python benchmarks/batched.py --prompt-set humaneval --offset 10 --n-prompts 8 --batches 1,2,4,8 \
        --tokens 64 --out docs/results/batched

Target: the packaged Qwen2.5-Coder-1.5B, int8 (specbound's fbgemm kernels, batch-invariant attention),
read through the static KV cache; draft: the 0.5B, int8, static cache (rows of both share passes).
Methods, all greedy, each decoding the same held-out prompts in groups of B (order rotated per group):

* ``plain``: specbound's plain batched decoding (one shared target pass per token of every request);
* ``sd γ=…``: ``speculative_decode_batch`` with that draft length ("auto": each request sizes its chain
  against the shared pass);
* ``hf-generate``: Hugging Face ``generate`` on the same int8 target with a left-padded batch of B.

Every run decodes exactly ``--tokens`` new tokens (no stop token), so all methods do the same work.
Prints a table and writes JSON + markdown. A benchmark: it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from specbound.runtime import configure_process

configure_process()

import torch  # noqa: E402

from specbound.assets.prompts import format_prompt, load_prompts  # noqa: E402
from specbound.decoding.batch import autoregressive_decode_batch, speculative_decode_batch  # noqa: E402
from specbound.decoding.costs import load_or_measure_costs  # noqa: E402
from specbound.models.loading import load_pair  # noqa: E402
from specbound.runtime import configure_threads  # noqa: E402
from specbound.theory.speedup import batch_throughput  # noqa: E402


def _hf_generate(target, groups_ids, tokens):
    """HF generate on a left-padded batch: (seconds, per-request new token lists)."""
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(ids) for ids in groups_ids)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in groups_ids])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in groups_ids])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=tokens,
                                    min_new_tokens=tokens, do_sample=False, pad_token_id=pad)
    seconds = time.perf_counter() - t0
    return seconds, [row[width:].tolist() for row in out]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-set", default="humaneval")
    ap.add_argument("--offset", type=int, default=10)
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--gammas", default="auto,4")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--no-hf", action="store_true", help="leave out HF generate")
    ap.add_argument("--out", default="docs/results/batched")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    gammas = [g if g == "auto" else int(g) for g in args.gammas.split(",")]
    configure_threads(0)
    target, draft = load_pair(progress=False, target_precision="int8", draft_int8=True, draft_engine="torch")
    prompts = load_prompts(args.prompt_set, limit=args.n_prompts, offset=args.offset)
    ids = [target.tokenizer(format_prompt(target.tokenizer, p), return_tensors="pt").input_ids[0].tolist()
           for p in prompts]
    costs = load_or_measure_costs(target, draft)
    methods = ["plain"] + [f"sd γ={g}" for g in gammas] + ([] if args.no_hf else ["hf-generate"])
    # warm-up: every method once on a short prompt pair
    warm = [ids[0][:16], ids[1][:12]]
    autoregressive_decode_batch(target, warm, 4, temperature=0)
    for g in gammas:
        speculative_decode_batch(target, draft, warm, 8, gamma=g, temperature=0)
    if not args.no_hf:
        _hf_generate(target, warm, 4)
    runs = []
    t_start = time.perf_counter()
    for B in batches:
        groups = [list(range(i, min(i + B, len(ids)))) for i in range(0, len(ids), B)]
        for gi, group in enumerate(groups):
            order = methods[gi % len(methods):] + methods[:gi % len(methods)]
            for method in order:
                batch_ids = [ids[i] for i in group]
                if method == "hf-generate":
                    seconds, outs = _hf_generate(target, batch_ids, args.tokens)
                    rows = [{"prompt": prompts[i].id, "tokens": o, "latency": seconds, "tau": 1.0}
                            for i, o in zip(group, outs)]
                    wall, passes = seconds, args.tokens
                else:
                    if method == "plain":
                        res = autoregressive_decode_batch(target, batch_ids, args.tokens, temperature=0)
                    else:
                        g = method.split("=")[1]
                        res = speculative_decode_batch(target, draft, batch_ids, args.tokens,
                                                       gamma=g if g == "auto" else int(g), temperature=0)
                    rows = [{"prompt": prompts[i].id, "tokens": r.tokens, "latency": r.metrics.total_time,
                             "tau": r.metrics.tau, "drafted_per_round": statistics.fmean(r.metrics.drafted_per_step),
                             "acceptance": r.metrics.acceptance_per_position[:8]} for i, r in zip(group, res)]
                    wall, passes = res.wall_time, res.target_passes
                runs.append({"B": B, "group": gi, "method": method, "wall": wall, "target_passes": passes,
                             "new_tokens": sum(len(r["tokens"]) for r in rows), "requests": rows})
            print(f"B={B} group {gi} done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr)

    # ------------------------------------------------------------------ summary
    reference = {(r["requests"][j]["prompt"]): r["requests"][j]["tokens"]
                 for r in runs if r["method"] == "plain" and r["B"] == batches[0] for j in range(len(r["requests"]))}
    alone_tau = {q["prompt"]: q["tau"] for r in runs if r["B"] == 1 for q in r["requests"]
                 if r["method"] == f"sd γ={gammas[-1]}"}
    summary = {}
    for B in batches:
        for method in methods:
            sel = [r for r in runs if r["B"] == B and r["method"] == method]
            tokens = sum(r["new_tokens"] for r in sel)
            wall = sum(r["wall"] for r in sel)
            lat = [q["latency"] for r in sel for q in r["requests"]]
            same = sum(q["tokens"] == reference.get(q["prompt"]) for r in sel for q in r["requests"])
            taus = [q["tau"] for r in sel for q in r["requests"]]
            group_rates = [r["new_tokens"] / r["wall"] for r in sel]
            summary[(B, method)] = {
                "tokens_per_second": tokens / wall, "group_rate_min": min(group_rates), "group_rate_max": max(group_rates),
                "latency_mean": statistics.fmean(lat), "tau": statistics.fmean(taus), "identical": same,
                "requests": len(lat),
                "drafted_per_round": statistics.fmean([q.get("drafted_per_round", 0.0) for r in sel
                                                       for q in r["requests"]])}
    # prediction: plain B / t(B); chain γ: B·E[tokens](α, γ) / (γ·d(B) + t(B(γ+1))), α per depth measured
    # at B = 1 with the same fixed γ (the requests alone)
    fixed = [g for g in gammas if g != "auto"]
    alpha = None
    if fixed and 1 in batches:
        acc = [q["acceptance"] for r in runs if r["B"] == 1 and r["method"] == f"sd γ={fixed[0]}"
               for q in r["requests"]]
        depth = max(len(a) for a in acc)
        alpha = [statistics.fmean([a[i] for a in acc if len(a) > i and a[i] == a[i]]) for i in range(depth)]
    lines = [f"# Batched requests ({time.strftime('%Y-%m-%d')})", "",
             f"`python benchmarks/batched.py --prompt-set {args.prompt_set} --offset {args.offset} "
             f"--n-prompts {args.n_prompts} --batches {args.batches} --gammas {args.gammas} --tokens {args.tokens}`", "",
             f"Target {target.name} ({target.info.kernels}); draft {draft.name} ({draft.info.kernels}); greedy; "
             f"{args.tokens} new tokens per request (no stop token); {len(prompts)} held-out prompts "
             f"({prompts[0].id} … {prompts[-1].id}) decoded in groups of B, methods interleaved per group in a "
             f"rotated order, one process; torch threads {torch.get_num_threads()}. Throughput = all new tokens / "
             "summed wall time of the groups (prefill included: each group starts from its prompts); range = "
             "slowest–fastest group; latency = mean per-request time from its first prefill to its last token "
             "(HF generate: the batch's time); identical = requests whose tokens equal plain decoding at B = "
             f"{batches[0]}.", "",
             "| B | method | tok/s total | group range | × plain | latency s | τ | drafted/round | identical | predicted tok/s |",
             "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for B in batches:
        plain = summary[(B, "plain")]["tokens_per_second"]
        for method in methods:
            s = summary[(B, method)]
            pred = ""
            if method == "plain":
                pred = batch_throughput(0.0, 0, B, costs.draft, costs.target)
            elif alpha is not None and method != "hf-generate" and method.split("=")[1] != "auto":
                pred = batch_throughput(alpha, int(method.split("=")[1]), B, costs.draft, costs.target)
            s["predicted"] = pred if pred != "" else None
            lines.append(f"| {B} | {method} | {s['tokens_per_second']:.2f} | {s['group_rate_min']:.1f}–"
                         f"{s['group_rate_max']:.1f} | {s['tokens_per_second'] / plain:.2f} | {s['latency_mean']:.2f} | "
                         f"{s['tau']:.2f} | {s['drafted_per_round']:.2f} | {s['identical']}/{s['requests']} | "
                         + (f"{pred:.2f}" if pred != "" else "") + " |")
    if alpha is not None:
        lines += ["", f"Prediction (theory/speedup.py `batch_throughput`): per-depth greedy acceptance α measured on the "
                  f"requests alone (B = 1, γ = {fixed[0]}): " + ", ".join(f"{a:.2f}" for a in alpha) +
                  "; costs t(k), d(k): this machine's calibration (`~/.cache/specbound/costs.json`), "
                  "t(1) = %.1f ms, t(8) = %.1f ms, t(32) = %.1f ms, d(1) = %.1f ms, d(8) = %.1f ms." % (
                      1e3 * float(costs.target(1)), 1e3 * float(costs.target(8)), 1e3 * float(costs.target(32)),
                      1e3 * float(costs.draft(1)), 1e3 * float(costs.draft(8)))]
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"batched-{args.prompt_set}.md").write_text(text)
    (out / f"batched-{args.prompt_set}.json").write_text(json.dumps(
        {"runs": runs, "summary": {f"{b}|{m}": v for (b, m), v in summary.items()}, "alpha": alpha}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
