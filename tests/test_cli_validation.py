"""Every cheap argument of the real-model commands is checked before any model loads (issue: reliability).

The loaders are replaced by functions that fail the test if called, so a check that only happens after
loading (≈ 60 s on the real pair) shows up as "model loaded" instead of the expected message.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specbound.cli import main


@pytest.mark.parametrize("argv, message", [
    (["generate", "--gamma", "0"], "--gamma must be an integer >= 1"),
    (["generate", "--gamma", "-3"], "--gamma must be an integer >= 1"),
    (["generate", "--gamma", "many"], "--gamma must be an integer >= 1"),
    (["generate", "--prompt", "   "], "--prompt is empty"),
    (["generate", "--prompt", "bad \udcff byte"], "not valid UTF-8"),
    (["generate", "--prompt-set", "nosuchset"], "unknown prompt set 'nosuchset'"),
    (["generate", "--prompt-set", "builtin", "--index", "99999"], "--index 99999"),
    (["generate", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["generate", "--compile", "--target-precision", "fp32"], "--compile reads a quantised target"),
    (["advise", "--compile", "--engine", "llamacpp"], "--compile reads the torch target"),
    (["generate", "--prompt-set", "builtin", "--index", "0,x"], "--index must be an integer or a comma"),
    (["generate", "--prompt-set", "builtin", "--index", "0,99999"], "--index 99999"),
    (["generate", "--prompt-file", "/nonexistent/prompts.txt"], "no such file"),
    (["generate", "--temperature", "-1"], "temperature"),
    (["generate", "--top-p", "1.5"], "top_p"),
    (["generate", "--tree", "0"], "capacity P"),
    (["generate", "--verification", "block", "--tree", "4"], "verifies one drafted chain"),
    (["generate", "--verification", "block", "--relaxation", "opt:0.1"], "cannot be combined with a relaxation"),
    (["generate", "--threads", "-1"], "--threads"),
    (["generate", "--shape", "auto", "--gamma", "4"], "shape='auto' chooses the drafted shape"),
    (["generate", "--shape", "auto", "--prompt-set", "builtin", "--index", "0,1"], "--shape auto decodes one prompt"),
    (["bench", "--n-prompts", "0"], "--n-prompts must be >= 1"),
    (["bench", "--seeds", "0"], "--seeds must be >= 1"),
    (["bench", "--modes", "fast"], "--modes: unknown"),
    (["bench", "--methods", "hf-generate,nope"], "--methods: unknown"),
    # bench's default methods include llama.cpp ones: without the binding, that is the first error it names
    pytest.param(["bench", "--prompt-set", "nosuchset"], "nosuchset", marks=pytest.mark.llamacpp),
    (["bench", "--contention", "--verify-cost"], "pick one"),
    (["bench", "--batch", "1,2", "--contention"], "pick one"),
    (["bench", "--batch", "1,2", "--gammas", "auto,0"], "--gammas: each entry"),
    (["bench", "--batch", "1,2", "--prompt-set", "nosuchset"], "nosuchset"),
    (["advise", "--batch", "1,2", "--engine", "llamacpp"], "--batch needs --engine torch"),
    (["advise", "--batch-context", "64"], "--batch-context needs --batch"),
    (["advise", "--batch", "1,2", "--batch-context", "1"], "--batch-context must be >= 2"),
    (["bench", "--contention", "--prompt-set", "nosuchset"], "nosuchset"),
    (["advise", "--tokens", "0"], "--tokens must be >= 1"),
    (["advise", "--modes", "greedy,hot"], "--modes"),
    (["advise", "--prompt-set", "nosuchset"], "nosuchset"),
])
def test_bad_arguments_fail_fast_before_any_model_loads(argv, message, no_model_loads, tmp_path, capsys):
    if argv[0] in ("bench", "advise"):
        argv = argv + ["--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_non_integer_seed_is_an_argparse_error_not_a_traceback(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["generate", "--seed", "abc"])
    assert stop.value.code == 2
    assert "invalid int value: 'abc'" in capsys.readouterr().err


def test_the_cli_sets_passive_openmp_waiting_unless_the_user_chose():
    """`OMP_WAIT_POLICY=PASSIVE` before torch loads when asked for (SPECBOUND_OMP_WAIT=passive; `auto`
    depends on the machine's load, tests/test_runtime.py); a policy the user set is kept."""
    code = ("import os, sys; from specbound.cli import main; "
            "main(['theory', '--json', '--states', '3', '--horizon', '2']); "
            "print(os.environ.get('OMP_WAIT_POLICY'), file=sys.stderr)")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["SPECBOUND_OMP_WAIT"] = "passive"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stderr.strip().splitlines()[-1] == "PASSIVE"
    done = subprocess.run([sys.executable, "-c", code], env=dict(env, OMP_WAIT_POLICY="ACTIVE"),
                          capture_output=True, text=True, check=True)
    assert done.stderr.strip().splitlines()[-1] == "ACTIVE"
