"""Ctrl-C for real: a SIGINT sent to a running `specbound generate` process stops it within one round,
prints the text and the metrics so far, and exits 130 without a traceback (issue: reliability).

The child process decodes with tiny random-init transformers whose target forward is slowed down
(50 ms per call), so a 400-token run would take far longer than the test waits; the models are
swapped in for `load_pair` by a short driver script (no weights, no download).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

DRIVER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    import torch
    torch.set_num_threads(1)
    from helpers import CharTokenizer, tiny_pair
    from specbound.models import loading
    from specbound.models.hf import HFModel

    class SlowHF(HFModel):
        def forward(self, tokens, keep_logits=None):
            time.sleep(0.05)
            return super().forward(tokens, keep_logits)
        def forward_tree(self, tokens, parents):
            time.sleep(0.05)
            return super().forward_tree(tokens, parents)

    base, draft_model = tiny_pair(0, noise=0.5, draft_seed=1)
    target = SlowHF(base, CharTokenizer(), name="tiny-target")
    draft = HFModel(draft_model, CharTokenizer(), name="tiny-draft")
    loading.load_pair = lambda *a, **k: (target, draft)
    from specbound.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("extra", [[], ["--tree", "8"]], ids=["chain", "tree"])
def test_sigint_during_generation_stops_within_a_round_and_exits_130(tmp_path, extra):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(tests=str(Path(__file__).parent)))
    argv = [sys.executable, str(driver), "generate", "--prompt", "def add(a, b):", "--max-new-tokens", "400",
            "--ignore-eos", "--threads", "1", "--target-precision", "int8", *(extra or ["--gamma", "3"])]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # a suite started as a background job of a non-interactive shell ignores SIGINT, and a child inherits
    # that: start the child with the default disposition, as a terminal's Ctrl-C would find it
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # wait until generated text streams (the prompt line comes first, then generated characters)
        first = child.stdout.read(len("def add(a, b):") + 3)
        assert first.startswith(b"def add"), first
        time.sleep(0.5)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
        stopped_after = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
    err = err.decode()
    assert child.returncode == 130, err
    assert "Traceback" not in err, err
    assert "interrupted" in err
    assert "(interrupted)" in err and "τ (tokens per target call)" in err     # the metrics so far are printed
    # one round here is at most a few 50 ms target reads; generous margin for a loaded CI machine
    assert stopped_after < 5.0, stopped_after
