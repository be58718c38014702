"""Decoding quiet and beside a busy neighbour, per OpenMP wait policy: plain decoding of the target,
speculative decoding with ``specbound generate``'s default drafting and llama.cpp plain decoding.

Why: an OpenMP worker that finished its share of a parallel region either spins (waiting for the next
region) or sleeps. Spinning wins on a quiet machine (a decoding step is hundreds of small regions), but
on a 2-core machine a spinning worker and a neighbour fight for a core. This benchmark measures every
libgomp choice (``OMP_WAIT_POLICY`` PASSIVE or ACTIVE, unset, unset with a smaller ``GOMP_SPINCOUNT``;
torch's and llama.cpp's OpenMP read the same variables) side by side, quiet and with ONE CPU hog. The
policy is fixed when the OpenMP runtime starts, so each runs in its own child process (``python -m
specbound.experiments.contention --child``), which loads the pair once and measures every thread count
quiet and with the hog (medians of repeats). A benchmark: it reports, it asserts nothing. In full:
docs/notes.md (`experiments/contention.py`).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from ..assets.models import DEFAULT_TARGET
from ..assets.prompts import format_prompt, load_prompts
from ..decoding import autoregressive_decode, speculative_decode
from ..errors import SpecboundError
from ..models import loading as model_loading   # a module: tests and commands swap its loaders

__all__ = ["POLICIES", "ContentionResult", "ContentionRow", "run_contention", "start_hog", "markdown"]

#: Each policy's OpenMP environment (``None``: the variable is removed, libgomp's default applies).
POLICIES = {"PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None},
            "default (spin 300k)": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None},
            "spin 30k": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "30000"},
            "ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None}}
METHODS = ("plain", "specbound-chain", "llamacpp-plain")
HOG_CODE = "while True:\n    pass\n"


@dataclass
class ContentionRow:
    policy: str
    threads: int
    method: str                  # "plain" | "specbound-chain" | "llamacpp-plain"
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

    target, draft = model_loading.load_pair(args.target, args.draft, progress=False, target_precision="int8",
                                            draft_engine="auto")
    gguf = model_loading.load_gguf_model(args.target or DEFAULT_TARGET, progress=False)
    prompt = load_prompts(args.prompt_set, limit=1, offset=args.offset)[0]
    ids = target.tokenizer(format_prompt(target.tokenizer, prompt), return_tensors="pt").input_ids

    def plain():
        return autoregressive_decode(target, ids, args.plain_tokens, temperature=0.0).metrics.decode_tokens_per_second

    def chain():
        return speculative_decode(target, draft, ids, args.spec_tokens, temperature=0.0,
                                  gamma="auto").metrics.decode_tokens_per_second

    def llamacpp():
        return autoregressive_decode(gguf, ids, args.spec_tokens, temperature=0.0).metrics.decode_tokens_per_second

    runs = {"plain": plain, "specbound-chain": chain, "llamacpp-plain": llamacpp}
    for threads in args.threads:
        torch.set_num_threads(threads)
        for run in runs.values():                           # warm-up (pages, kernels, cost profile)
            run()
        found = {}
        for condition in ("quiet", "busy"):
            hog = start_hog() if condition == "busy" else None
            try:
                if hog is not None:
                    time.sleep(0.5)
                for name, run in runs.items():
                    found[(name, condition)] = [run() for _ in range(args.repeats)]
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
        for name in runs:
            row = {"policy": args.policy, "threads": threads, "method": name,
                   "quiet_tokens_per_second": found[(name, "quiet")],
                   "busy_tokens_per_second": found[(name, "busy")]}
            print(json.dumps(row), flush=True)
    print(json.dumps({"prompt": prompt.id}), flush=True)
    return 0


def run_contention(target=None, draft=None, prompt_set: str = "humaneval", offset: int = 10,
                   threads=(2,), plain_tokens: int = 16, spec_tokens: int = 48, repeats: int = 2,
                   policies=tuple(POLICIES), progress=None) -> ContentionResult:
    """One child process per OpenMP wait policy; rows for every (policy, threads, method)."""
    rows, prompt_id = [], "?"
    for policy in policies:
        if progress:
            progress(f"OMP_WAIT_POLICY={policy}")
        argv = [sys.executable, "-m", "specbound.experiments.contention", "--child", "--policy", policy,
                "--prompt-set", prompt_set, "--offset", str(offset),
                "--threads", ",".join(map(str, threads)), "--plain-tokens", str(plain_tokens),
                "--spec-tokens", str(spec_tokens), "--repeats", str(repeats)]
        if target:
            argv += ["--target", str(target)]
        if draft:
            argv += ["--draft", str(draft)]
        env = dict(os.environ)
        for key, value in POLICIES[policy].items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SpecboundError(f"contention child ({policy}) failed:\n{done.stderr[-2000:]}")
        for line in done.stdout.splitlines():
            record = json.loads(line)
            if "prompt" in record:
                prompt_id = record["prompt"]
            else:
                rows.append(ContentionRow(**record))
    return ContentionResult(prompt_id, {"plain": plain_tokens, "specbound-chain": spec_tokens,
                                        "llamacpp-plain": spec_tokens}, repeats, rows)


def markdown(result: ContentionResult, command: str = "") -> str:
    lines = [f"# Decoding beside one CPU hog ({result.prompt})", "",
             f"`{command}`" if command else "", "",
             f"Decode tok/s (prefill excluded), greedy. plain: the int8 torch target, {result.tokens['plain']} tokens; "
             f"specbound-chain: `generate`'s default drafting (γ sized per round, llama.cpp draft when installed), "
             f"{result.tokens['specbound-chain']} tokens; llamacpp-plain: the target's Q4_K_M GGUF on llama.cpp, "
             f"{result.tokens['specbound-chain']} tokens. {result.repeats} repeats each, medians. "
             "Slowdown = quiet tok/s ÷ busy tok/s.", "",
             "| OpenMP policy | threads | method | quiet tok/s | with hog tok/s | slowdown |",
             "|---|---|---|---|---|---|"]
    for r in result.rows:
        q, b = statistics.median(r.quiet_tokens_per_second), statistics.median(r.busy_tokens_per_second)
        lines.append(f"| {r.policy} | {r.threads} | {r.method} | {q:.2f} | {b:.2f} | {r.slowdown:.2f}× |")
    return "\n".join(lines) + "\n"


def _main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--child", action="store_true")
    p.add_argument("--policy", default="?")
    p.add_argument("--target")
    p.add_argument("--draft")
    p.add_argument("--prompt-set", default="humaneval")
    p.add_argument("--offset", type=int, default=10)
    p.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[2, 1])
    p.add_argument("--plain-tokens", type=int, default=16)
    p.add_argument("--spec-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    if not args.child:
        p.error("run through `specbound bench --contention`")
    return _child(args)


if __name__ == "__main__":
    sys.exit(_main())
