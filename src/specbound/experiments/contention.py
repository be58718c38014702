"""Decoding beside a busy neighbour: the slowdown of plain and speculative decoding when ONE CPU hog
(a process spinning on one core) runs next to it, per OpenMP wait policy and torch thread count.

Why: with OpenMP's default *active* waiting, torch's worker threads spin between parallel regions;
when a neighbour holds a core, a spinning thread and the thread it waits for compete for that core
and a forward can take 10-40x longer. ``specbound``'s command line sets ``OMP_WAIT_POLICY=PASSIVE``
(unless the user set it) before torch loads; this benchmark measures both policies side by side.

The wait policy is fixed when the OpenMP runtime starts, so each policy runs in its own child
process (``python -m specbound.experiments.contention --child``); the thread count is changed
inside the child. Each child loads the pair once, then for each thread count measures plain
decoding and speculative decoding (chain, draft sized per round) quiet and with the hog, on a
held-out prompt, several repeats each (medians). This is a benchmark: it reports, it asserts nothing.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

__all__ = ["ContentionResult", "ContentionRow", "run_contention", "start_hog", "markdown"]

POLICIES = ("PASSIVE", "ACTIVE")
HOG_CODE = "while True:\n    pass\n"


@dataclass
class ContentionRow:
    policy: str
    threads: int
    method: str                  # "plain" | "specbound-chain"
    quiet_tokens_per_second: list[float]
    busy_tokens_per_second: list[float]

    @property
    def slowdown(self) -> float:
        """median quiet tok/s / median busy tok/s (1 = unaffected by the neighbour)."""
        return statistics.median(self.quiet_tokens_per_second) / statistics.median(self.busy_tokens_per_second)


@dataclass
class ContentionResult:
    prompt: str
    tokens: dict
    repeats: int
    rows: list[ContentionRow] = field(default_factory=list)


def start_hog() -> subprocess.Popen:
    """One process spinning on one core (the 'neighbour'); stop it with ``.kill()``."""
    return subprocess.Popen([sys.executable, "-c", HOG_CODE], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _child(args) -> int:
    """Measure in this process (its OMP_WAIT_POLICY was set by the parent); print one JSON line per row."""
    import torch

    from ..assets.prompts import format_prompt, load_prompts
    from ..decoding import autoregressive_decode, speculative_decode
    from ..models.loading import load_pair

    target, draft = load_pair(args.target, args.draft, progress=False, draft_int8=True)
    prompt = load_prompts(args.prompt_set, limit=1, offset=args.offset)[0]
    ids = target.tokenizer(format_prompt(target.tokenizer, prompt), return_tensors="pt").input_ids

    def plain():
        return autoregressive_decode(target, ids, args.plain_tokens, temperature=0.0).metrics.tokens_per_second

    def chain():
        return speculative_decode(target, draft, ids, args.spec_tokens, temperature=0.0,
                                  gamma="auto").metrics.tokens_per_second

    for threads in args.threads:
        torch.set_num_threads(threads)
        plain(), chain()                                    # warm-up (pages, kernels, cost profile)
        found = {}
        for condition in ("quiet", "busy"):
            hog = start_hog() if condition == "busy" else None
            try:
                if hog is not None:
                    time.sleep(0.5)
                for name, run in (("plain", plain), ("specbound-chain", chain)):
                    found[(name, condition)] = [run() for _ in range(args.repeats)]
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
        for name in ("plain", "specbound-chain"):
            row = {"policy": os.environ.get("OMP_WAIT_POLICY", "default"), "threads": threads, "method": name,
                   "quiet_tokens_per_second": found[(name, "quiet")],
                   "busy_tokens_per_second": found[(name, "busy")]}
            print(json.dumps(row), flush=True)
    print(json.dumps({"prompt": prompt.id}), flush=True)
    return 0


def run_contention(target=None, draft=None, prompt_set: str = "humaneval", offset: int = 10,
                   threads=(2, 1), plain_tokens: int = 12, spec_tokens: int = 32, repeats: int = 2,
                   policies=POLICIES, progress=None) -> ContentionResult:
    """One child process per OpenMP wait policy; rows for every (policy, threads, method)."""
    from ..errors import SpecboundError

    rows, prompt_id = [], "?"
    for policy in policies:
        if progress:
            progress(f"OMP_WAIT_POLICY={policy}")
        argv = [sys.executable, "-m", "specbound.experiments.contention", "--child",
                "--prompt-set", prompt_set, "--offset", str(offset),
                "--threads", ",".join(map(str, threads)), "--plain-tokens", str(plain_tokens),
                "--spec-tokens", str(spec_tokens), "--repeats", str(repeats)]
        if target:
            argv += ["--target", str(target)]
        if draft:
            argv += ["--draft", str(draft)]
        env = dict(os.environ, OMP_WAIT_POLICY=policy)
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SpecboundError(f"contention child ({policy}) failed:\n{done.stderr[-2000:]}")
        for line in done.stdout.splitlines():
            record = json.loads(line)
            if "prompt" in record:
                prompt_id = record["prompt"]
            else:
                rows.append(ContentionRow(**record))
    return ContentionResult(prompt_id, {"plain": plain_tokens, "specbound-chain": spec_tokens}, repeats, rows)


def markdown(result: ContentionResult, command: str = "") -> str:
    lines = [f"# Decoding beside one CPU hog ({result.prompt})", "",
             f"`{command}`" if command else "", "",
             f"Plain decoding: {result.tokens['plain']} tokens; specbound chain (γ sized per round): "
             f"{result.tokens['specbound-chain']} tokens; greedy; {result.repeats} repeats each, medians. "
             "Slowdown = quiet tok/s ÷ busy tok/s (target ≤ 2×).", "",
             "| OMP_WAIT_POLICY | torch threads | method | quiet tok/s | with hog tok/s | slowdown |",
             "|---|---|---|---|---|---|"]
    for r in result.rows:
        q, b = statistics.median(r.quiet_tokens_per_second), statistics.median(r.busy_tokens_per_second)
        lines.append(f"| {r.policy} | {r.threads} | {r.method} | {q:.2f} | {b:.2f} | {r.slowdown:.2f}× |")
    return "\n".join(lines) + "\n"


def _main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--child", action="store_true")
    p.add_argument("--target")
    p.add_argument("--draft")
    p.add_argument("--prompt-set", default="humaneval")
    p.add_argument("--offset", type=int, default=10)
    p.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[2, 1])
    p.add_argument("--plain-tokens", type=int, default=12)
    p.add_argument("--spec-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    if not args.child:
        p.error("run through `specbound bench --contention`")
    return _child(args)


if __name__ == "__main__":
    sys.exit(_main())
