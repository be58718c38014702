"""llama.cpp's own speculative decoding at its best settings against `specbound generate`'s default, on held-out
prompts, side by side in one run.

The peer is ``llama-speculative-simple`` built from the llama.cpp that the pinned llama-cpp-python sdist vendors
(``cmake -B build && cmake --build build --target llama-speculative-simple`` in its ``vendor/llama.cpp``; pass
the binary with ``--binary``). It decodes the packaged Q4_K_M target file with, per prompt, every setting of a
grid — the q4_0 draft file specbound drafts with (``--spec-type draft-simple``, ``--spec-draft-n-max`` 3/8/16,
``--draft-p-min`` 0 and 0.75), its n-gram speculators alone (``ngram-simple``, ``ngram-map-k``, ``ngram-mod``,
``ngram-cache``) and the draft beside an n-gram speculator — and the prompt's best setting is what we compare
with (a maximum over noisy runs: it favours the peer). Its figure is the "decoded N tokens in S seconds" line
(prompt encoding excluded). Ours: the default (kquant target on this CPU's kernel path, the same q4_0 draft
file on llama.cpp, γ = auto, the context mixed in), decode tokens/s, prefill excluded; plain llama.cpp
(``Llama.generate`` on the same Q4_K_M file) beside both. Greedy, 2 threads, ``--max-new-tokens`` tokens;
ours and plain llama.cpp the median of ``--repeats``.

    python benchmarks/llamacpp_speculative.py --binary /path/to/llama-speculative-simple --out docs/results/llamacpp-speculative
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOADS = (("humaneval", 20), ("edit", 10), ("mtbench-turn2", 10), ("gsm8k", 20), ("mtbench", 20))
GRID = ([("draft-simple", ["--spec-draft-n-max", str(n), "--draft-p-min", p]) for n in (3, 8, 16) for p in ("0", "0.75")]
        + [(t, []) for t in ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")]
        + [(f"draft-simple,{t}", ["--spec-draft-n-max", "8"]) for t in ("ngram-simple", "ngram-map-k")])
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")


def peer_run(binary: str, target: str, draft: str, prompt_file: str, spec_type: str, extra: list[str], n: int,
             threads: int) -> float | None:
    """Decode tokens/s of one llama-speculative-simple run (None when it failed)."""
    cmd = [binary, "-m", target, "-f", prompt_file, "-n", str(n), "--temp", "0", "-t", str(threads), "-c", "4096",
           "--spec-type", spec_type, *extra]
    if "draft" in spec_type:
        cmd += ["-md", draft, "-td", str(threads)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return None
    match = DECODED.search(done.stdout + done.stderr)
    if done.returncode != 0 or match is None:
        return None
    tokens, seconds = int(match.group(1)), float(match.group(2))
    return tokens / seconds if seconds > 0 else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", required=True, help="path to llama-speculative-simple")
    ap.add_argument("--workloads", default=",".join(f"{s}:{o}" for s, o in WORKLOADS))
    ap.add_argument("--n-prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="docs/results/llamacpp-speculative")
    args = ap.parse_args(argv)
    if not os.access(args.binary, os.X_OK):
        raise SystemExit(f"{args.binary}: not an executable llama-speculative-simple (see this script's docstring)")

    from specbound.assets.gguf import gguf_path
    from specbound.assets.models import DEFAULT_DRAFT, DEFAULT_TARGET
    from specbound.assets.prompts import format_prompt, load_prompts
    from specbound.decoding import SamplingConfig
    from specbound.models.kquant import kernel_path
    from specbound.models.loading import gguf_file
    from specbound.runtime import configure_threads

    sys.path.insert(0, str(Path(__file__).parent))
    from context_drafts import _cpu, decode, load_models

    threads = configure_threads(0)
    target_file = str(gguf_path(DEFAULT_TARGET, progress=False))
    draft_file = str(gguf_file(DEFAULT_DRAFT, False, "q4_0"))
    target, draft, _, llama = load_models(0)
    models = {"target": target, "draft": draft, "llama": llama}
    greedy = SamplingConfig(0.0)
    tokenizer = target.tokenizer
    warm = tokenizer("def f(x):\n", return_tensors="pt").input_ids
    for method in ("llamacpp", "chain+context"):
        decode(method, models, warm, 8, greedy, 0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for set_name, offset in (w.split(":") for w in args.workloads.split(",")):
            for prompt in load_prompts(set_name, limit=args.n_prompts, offset=int(offset)):
                text = format_prompt(tokenizer, prompt)
                prompt_file = Path(tmp) / "prompt.txt"
                prompt_file.write_text(text)
                ids = tokenizer(text, return_tensors="pt").input_ids
                ours, plain = [], []
                for r in range(args.repeats):
                    ours.append(decode("chain+context", models, ids, args.max_new_tokens, greedy, r)[1])
                    plain.append(decode("llamacpp", models, ids, args.max_new_tokens, greedy, r)[1])
                grid = {}
                for spec_type, extra in GRID:
                    label = spec_type + ("" if not extra else " " + " ".join(extra))
                    grid[label] = peer_run(args.binary, target_file, draft_file, str(prompt_file), spec_type, extra,
                                           args.max_new_tokens, threads)
                ok = {k: v for k, v in grid.items() if v is not None}
                best = max(ok, key=ok.get) if ok else None
                row = {"set": set_name, "prompt": prompt.id, "ours": statistics.median(ours), "ours_runs": ours,
                       "llamacpp_plain": statistics.median(plain), "plain_runs": plain, "peer_grid": grid,
                       "peer_best": best, "peer_best_tok_s": ok.get(best)}
                rows.append(row)
                print(f"{prompt.id}: ours {row['ours']:.1f}, plain llama.cpp {row['llamacpp_plain']:.1f}, "
                      f"llama.cpp speculative best {row['peer_best_tok_s'] or float('nan'):.1f} ({best})",
                      file=sys.stderr, flush=True)
    result = {"date": time.strftime("%Y-%m-%d"), "cpu": _cpu(), "cores": os.cpu_count(), "path": kernel_path(),
              "threads": threads, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "rows": rows,
              "command": "python benchmarks/llamacpp_speculative.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    text = report(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "llamacpp-speculative.json").write_text(json.dumps(result, indent=1))
    (out / "llamacpp-speculative.md").write_text(text)
    print(text)
    return 0


def report(result: dict) -> str:
    lines = [f"# llama.cpp's own speculative decoding at its best settings ({result['date']}, {result['cpu']}, "
             f"{result['cores']} cores, kernel path {result['path']})", "",
             f"`{result['command']}` — greedy, {result['max_new_tokens']} tokens, {result['threads']} threads; the "
             "peer's best of its grid per prompt (one run each); ours and plain llama.cpp median of "
             f"{result['repeats']}.", "",
             "| prompt | ours tok/s | plain llama.cpp | llama.cpp speculative (best setting) | ours / peer | "
             "ours / plain |", "|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        peer = r["peer_best_tok_s"]
        peer_cell = "failed" if peer is None else f"{peer:.1f} ({r['peer_best']})"
        ratio_cell = "-" if peer is None else f"{r['ours'] / peer:.2f}"
        lines.append(f"| {r['prompt']} | {r['ours']:.1f} | {r['llamacpp_plain']:.1f} | {peer_cell} | {ratio_cell} | "
                     f"{r['ours'] / r['llamacpp_plain']:.2f} |")
    for s in dict.fromkeys(r["set"] for r in result["rows"]):
        sub = [r for r in result["rows"] if r["set"] == s and r["peer_best_tok_s"]]
        if sub:
            ratios = [r["ours"] / r["peer_best_tok_s"] for r in sub]
            lines.append(f"\n{s}: ours / llama.cpp speculative median {statistics.median(ratios):.2f} "
                         f"({min(ratios):.2f}–{max(ratios):.2f})")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
