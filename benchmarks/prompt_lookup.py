"""Would drafts that cost no forward pay here? Prompt lookup (n-gram) proposals measured against the
target's own greedy output, beside the model drafter's rounds on the same text. Held-out prompts.

    python benchmarks/prompt_lookup.py --sets humaneval:18,gsm8k:16,mtbench:16 --n-prompts 8 \
        --out docs/results/prompt-lookup

For each prompt the target (int8 torch, the packaged 1.5B) decodes greedily with generate's default
drafter (the draft's GGUF on llama.cpp when installed, else the int8 torch draft, γ = auto); greedy SD
is token-identical to the target's own greedy decoding, so its output IS the text a prompt-lookup
drafter would have to predict. Then, offline on that text:

* **prompt lookup alone** (no draft model): at each round start, the longest n-gram (n = 4..1) ending
  at the current position that occurred earlier in prompt + output proposes the tokens that followed
  it (at most ``--lookup-tokens``); the target accepts the common prefix with its greedy text, plus
  one token. τ_lookup = tokens per target pass; its speed is estimated with the measured mean target
  seconds per round of the SD run (t(k) is nearly flat for k ≤ 8 on the int8 target).
* **the best mixture the model drafter could get** (an upper bound): at each round of the real SD run,
  if the lookup proposal at that round's start would have been accepted at least as far as the model's
  draft was, that round's drafting time could have been saved. Draft seconds are split over rounds in
  proportion to the tokens drafted. No realisable rule picks these rounds better (it does not know the
  acceptance in advance), so the saving is an upper bound on what mixing lookup nodes into the chain
  can give at greedy.

Prints a table and writes JSON + markdown. A benchmark: it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from specbound.runtime import configure_process

configure_process()

from specbound.assets.prompts import format_prompt, load_prompts  # noqa: E402
from specbound.decoding import speculative_decode  # noqa: E402
from specbound.models.loading import load_pair  # noqa: E402
from specbound.models.tokens import stop_token_ids  # noqa: E402
from specbound.runtime import configure_threads  # noqa: E402


def lookup_proposal(context: list[int], max_n: int = 4, max_tokens: int = 8) -> list[int]:
    """The prompt-lookup proposal after ``context``: the tokens that followed the most recent earlier
    occurrence of the longest suffix n-gram (n = max_n..1); [] when no suffix occurred before."""
    for n in range(min(max_n, len(context) - 1), 0, -1):
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):      # most recent earlier occurrence first
            if context[start:start + n] == suffix:
                follow = context[start + n:start + n + max_tokens]
                if follow:
                    return follow
    return []


def accepted_prefix(proposal: list[int], truth: list[int]) -> int:
    k = 0
    while k < len(proposal) and k < len(truth) and proposal[k] == truth[k]:
        k += 1
    return k


def lookup_alone(prompt: list[int], output: list[int], max_tokens: int) -> tuple[int, int]:
    """(target passes, accepted lookup tokens) of greedy prompt-lookup SD over ``output``."""
    pos, passes, accepted = 0, 0, 0
    while pos < len(output):
        proposal = lookup_proposal(prompt + output[:pos], max_tokens=max_tokens)
        a = accepted_prefix(proposal, output[pos:])
        a = min(a, len(output) - pos - 1)
        passes += 1
        accepted += a
        pos += a + 1
    return passes, accepted


def measure(target, draft, ids: list[int], tokens: int, max_tokens: int) -> dict:
    res = speculative_decode(target, draft, [ids], tokens, temperature=0.0, gamma="auto",
                             stop_token_ids=stop_token_ids(target))
    m, out = res.metrics, res.tokens
    drafted = sum(r.size for r in res.rounds) or 1
    decode_seconds = m.total_time - m.prefill_time
    saved, lookup_rounds = 0.0, 0
    for r in res.rounds:
        pos = r.committed - len(ids)
        proposal = lookup_proposal(ids + out[:pos], max_tokens=max_tokens)
        a = accepted_prefix(proposal, out[pos:])
        if proposal and a >= r.accepted:
            lookup_rounds += 1
            saved += m.draft_time * r.size / drafted
    passes, accepted = lookup_alone(ids, out, max_tokens)
    target_per_round = m.target_time / max(1, m.target_calls)
    return {
        "new_tokens": len(out), "rounds": len(res.rounds), "tau_sd": len(out) / max(1, m.target_calls),
        "decode_seconds": decode_seconds, "draft_seconds": m.draft_time, "target_seconds": m.target_time,
        "sd_tok_s": len(out) / decode_seconds if decode_seconds > 0 else float("nan"),
        "tau_lookup": len(out) / max(1, passes), "lookup_accepted_share": accepted / max(1, len(out)),
        "lookup_alone_tok_s_est": len(out) / (passes * target_per_round) if target_per_round > 0 else float("nan"),
        "mixture_rounds": lookup_rounds, "mixture_saved_seconds": saved,
        "mixture_tok_s_upper": len(out) / (decode_seconds - saved) if decode_seconds - saved > 0 else float("nan"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="humaneval:18,gsm8k:16,mtbench:16",
                    help="comma-separated SET:OFFSET (held-out slices)")
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--lookup-tokens", type=int, default=8, help="longest lookup proposal (tokens)")
    ap.add_argument("--out", default="docs/results/prompt-lookup")
    args = ap.parse_args(argv)
    configure_threads(0)
    target, draft = load_pair(progress=False, target_precision="int8", draft_engine="auto")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"target": f"{target.name} ({target.info.kernels})", "draft": f"{draft.name} ({draft.info.kernels})",
              "tokens": args.tokens, "lookup_tokens": args.lookup_tokens, "sets": {}}
    lines = ["| set (prompts) | SD tok/s | τ SD | τ lookup alone | lookup-alone tok/s (est.) | tokens lookup could "
             "predict | rounds lookup ≥ model | SD with best mixture (upper bound) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for spec in args.sets.split(","):
        name, offset = spec.split(":")
        prompts = load_prompts(name, limit=args.n_prompts, offset=int(offset))
        tok = target.tokenizer
        speculative_decode(target, draft, [tok(format_prompt(tok, prompts[0]), add_special_tokens=False).input_ids],
                           8, temperature=0.0, gamma="auto")                 # warm-up (not reported)
        rows = []
        for p in prompts:
            ids = tok(format_prompt(tok, p), add_special_tokens=False).input_ids
            t0 = time.perf_counter()
            row = measure(target, draft, ids, args.tokens, args.lookup_tokens)
            row["prompt"], row["seconds"] = p.id, time.perf_counter() - t0
            rows.append(row)
            print(f"{p.id}: SD {row['sd_tok_s']:.1f} tok/s τ {row['tau_sd']:.2f}; lookup τ {row['tau_lookup']:.2f} "
                  f"(est. {row['lookup_alone_tok_s_est']:.1f} tok/s); mixture ≤ {row['mixture_tok_s_upper']:.1f} tok/s",
                  flush=True)
        med = {k: statistics.median(r[k] for r in rows) for k in
               ("sd_tok_s", "tau_sd", "tau_lookup", "lookup_alone_tok_s_est", "lookup_accepted_share",
                "mixture_tok_s_upper")}
        share_rounds = sum(r["mixture_rounds"] for r in rows) / max(1, sum(r["rounds"] for r in rows))
        gain = statistics.median(r["mixture_tok_s_upper"] / r["sd_tok_s"] for r in rows)
        report["sets"][name] = {"offset": int(offset), "rows": rows, "median": med, "mixture_round_share": share_rounds,
                                "median_mixture_gain_upper": gain}
        lines.append(f"| {name} {offset}–{int(offset) + len(prompts) - 1} ({len(prompts)}) | {med['sd_tok_s']:.1f} | "
                     f"{med['tau_sd']:.2f} | {med['tau_lookup']:.2f} | {med['lookup_alone_tok_s_est']:.1f} | "
                     f"{100 * med['lookup_accepted_share']:.0f}% | {100 * share_rounds:.0f}% | "
                     f"{med['mixture_tok_s_upper']:.1f} ({gain:.2f}×) |")
    md = "\n".join([f"# Prompt lookup against the model drafter (greedy, {args.tokens} tokens)", "",
                    f"Target {report['target']}; draft {report['draft']}; lookup proposals of at most "
                    f"{args.lookup_tokens} tokens; medians over prompts. Command: `python benchmarks/prompt_lookup.py "
                    f"--sets {args.sets} --n-prompts {args.n_prompts} --tokens {args.tokens}`.", ""] + lines + [""])
    (out_dir / "prompt_lookup.md").write_text(md)
    (out_dir / "prompt_lookup.json").write_text(json.dumps(report, indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
