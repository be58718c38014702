"""What `specbound generate`'s default does on each K-quant kernel path, against plain llama.cpp on the same
GGUF file, side by side in one process per path.

For each path (``SPECBOUND_KQUANT_PATH``, one fresh process each: the path is chosen at load) the worker
makes the default's target choice afresh (:func:`specbound.measure.deployment.choose_deployment`, not
the kept one), then decodes held-out prompts with what it chose — speculative decoding of the chosen
torch target with the q4_0 llama.cpp draft (γ = auto, as ``generate``), or plain llama.cpp where it fell
back — interleaved with llama.cpp's own generation loop (llama-cpp-python ``Llama.generate``, the
``llamacpp-plain`` peer of ``specbound bench``) on the packaged Q4_K_M target file. Greedy, EOS
ignored, decode tokens/s (prefill excluded); per prompt the median of the repeats, their ratio; the
order alternates per repeat.

    python benchmarks/default_vs_llamacpp.py --paths avx512vnni,avxvnni,avx2,portable --out docs/results/default-paths
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def worker(args) -> dict:
    from specbound.assets.gguf import gguf_path
    from specbound.assets.models import DEFAULT_TARGET
    from specbound.assets.prompts import format_prompt, load_prompts
    from specbound.decoding import SamplingConfig
    from specbound.experiments.bench import run_method
    from specbound.experiments.llamacpp_peers import open_llama
    from specbound.measure.deployment import choose_deployment
    from specbound.models.kquant import kernel_path
    from specbound.runtime import configure_threads

    configure_threads(0)
    t0 = time.perf_counter()
    decision, measured = choose_deployment(progress=False, use_cache=False)
    choice_seconds = time.perf_counter() - t0
    llm = open_llama(gguf_path(DEFAULT_TARGET, progress=False))
    tokenizer = (measured.get("kquant") or measured["llamacpp"]).tokenizer
    if decision.plain_llamacpp:
        default, models = "llamacpp-plain-raw", {"target": measured["llamacpp"], "llamacpp_raw": measured["llamacpp"]}
    else:
        default = "specbound-chain-lcdraft"
        models = {"target": measured[decision.target_precision], "draft_llamacpp": measured["draft"]}
    models["llamacpp_target"] = llm
    methods = [default, "llamacpp-plain"]
    kq = decision.candidate("kquant")
    if decision.plain_llamacpp and kq is not None and kq.t1 < 3 * decision.candidate("llamacpp").t1:
        # what the speculative setting it turned down gives, to check the choice (not on a path 3x slower)
        methods.append("specbound-chain-lcdraft")
        models.update(draft_llamacpp=measured["draft"], target=measured["kquant"])
    greedy = SamplingConfig(0.0)
    warm = tokenizer("def f(x):\n", return_tensors="pt").input_ids
    for method in methods:
        run_method(method, models, warm, 8, greedy, 0)
    rows = []
    for prompt in load_prompts(args.prompt_set, limit=args.n_prompts, offset=args.offset):
        ids = tokenizer(format_prompt(tokenizer, prompt), return_tensors="pt").input_ids
        rates = {m: [] for m in methods}
        for r in range(args.repeats):
            for method in (methods if r % 2 == 0 else methods[::-1]):
                _, run = run_method(method, models, ids, args.max_new_tokens, greedy, 0)
                rates[method].append(run.decode_tokens_per_second)
        ours, theirs = statistics.median(rates[default]), statistics.median(rates["llamacpp-plain"])
        rows.append({"prompt": prompt.id, "default": ours, "llamacpp": theirs, "ratio": ours / theirs,
                     "default_runs": rates[default], "llamacpp_runs": rates["llamacpp-plain"]})
        if len(methods) > 2:
            rows[-1]["declined_ratio"] = statistics.median(rates["specbound-chain-lcdraft"]) / theirs
        print(f"{kernel_path()} {prompt.id}: {ours:.1f} vs {theirs:.1f} tok/s = {ours / theirs:.2f}x", file=sys.stderr)
    return {"path": kernel_path(), "decision": decision.describe(), "engine": decision.engine,
            "target": decision.target_precision, "choice_seconds": choice_seconds,
            "candidates": [vars(c) for c in decision.candidates], "draft_d1": decision.draft_d1, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default="avx512vnni,avxvnni,avx2,portable")
    ap.add_argument("--prompt-set", default="humaneval")
    ap.add_argument("--offset", type=int, default=10)
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="docs/results/default-paths")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    results = []
    for path in args.paths.split(","):
        cmd = [sys.executable, __file__, "--worker", "--prompt-set", args.prompt_set, "--offset", str(args.offset),
               "--n-prompts", str(args.n_prompts), "--max-new-tokens", str(args.max_new_tokens),
               "--repeats", str(args.repeats)]
        done = subprocess.run(cmd, env={**os.environ, "SPECBOUND_KQUANT_PATH": path}, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"the worker for path {path} failed")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    import platform

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    lines = [f"# The default against plain llama.cpp, per K-quant kernel path ({time.strftime('%Y-%m-%d')}, {cpu}, "
             f"{os.cpu_count()} cores)", "",
             f"`python benchmarks/default_vs_llamacpp.py --paths {args.paths}` — {args.prompt_set} "
             f"{args.offset}–{args.offset + args.n_prompts - 1} (held out), greedy, {args.max_new_tokens} tokens, EOS "
             f"ignored, decode tokens/s, median of {args.repeats} interleaved repeats per prompt. Peer: llama.cpp's own "
             "loop (llama-cpp-python `Llama.generate`) on the same Q4_K_M file. The default: the target choice made "
             "afresh in each path's process, then what it chose.", "",
             "| path | chose | target t(1) / t(8) ms | llama.cpp t(1) ms | default tok/s (median) | llama.cpp tok/s | "
             "ratio: median (min–max over prompts) |", "|---|---|---:|---:|---:|---:|---:|"]
    for res in results:
        kq = next((c for c in res["candidates"] if c["name"] == "kquant"), None)
        ll = next((c for c in res["candidates"] if c["name"] == "llamacpp"), None)
        ratios = [r["ratio"] for r in res["rows"]]
        chose = "plain llama.cpp" if res["engine"] == "llamacpp" else f"{res['target']} + q4_0 draft"
        lines.append(f"| {res['path']} | {chose} | {kq['t1'] * 1e3:.0f} / {kq['t8'] * 1e3:.0f} | {ll['t1'] * 1e3:.0f} | "
                     f"{statistics.median(r['default'] for r in res['rows']):.1f} | "
                     f"{statistics.median(r['llamacpp'] for r in res['rows']):.1f} | "
                     f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |")
    lines += ["", "Per prompt (ratio of medians):", "", "| path | " + " | ".join(r["prompt"] for r in results[0]["rows"])
              + " |", "|---|" + "---:|" * len(results[0]["rows"])]
    for res in results:
        lines.append(f"| {res['path']} | " + " | ".join(f"{r['ratio']:.2f}" for r in res["rows"]) + " |")
    for res in results:
        declined = [r["declined_ratio"] for r in res["rows"] if "declined_ratio" in r]
        if declined:
            lines += ["", f"{res['path']}: the speculative kquant setting it turned down, run beside them: median "
                          f"{statistics.median(declined):.2f}× llama.cpp ({min(declined):.2f}–{max(declined):.2f})"]
    lines += ["", "What each process printed when it chose:", ""] + [f"- {r['path']}: {r['decision']}" for r in results]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "default-paths.md").write_text("\n".join(lines) + "\n")
    (out / "default-paths.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
