"""A draft whose output layer keeps the K most frequent tokens (models/trimmed.py): the trimmed file's
logits equal the full draft's on the kept rows bit for bit (every other token −inf), ids outside the
kept ones read as the fallback row, the kept set holds the most frequent tokens plus the special ones,
the copy is cached and rebuilt when damaged, and — the draft only proposes — greedy SD with it is
still the target's own greedy decoding (and at T > 0 decodes, the trimmed law being the proposal)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specbound.decoding import autoregressive_decode, speculative_decode
from specbound.errors import SpecboundError
from specbound.models.trimmed import TrimmedHeadModel, kept_tokens, trimmed_gguf

pytestmark = pytest.mark.llamacpp
pytest.importorskip("gguf")
pytest.importorskip("llama_cpp")

from gguf_tiny import tiny_vocab, write_tiny_llama_gguf  # noqa: E402
from specbound.models.llamacpp import LlamaCppModel  # noqa: E402

VOCAB = len(tiny_vocab()[0])


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("trimmed")
    return {"target": write_tiny_llama_gguf(root / "target.gguf", seed=0),
            "draft": write_tiny_llama_gguf(root / "draft.gguf", seed=0, noise=0.3, noise_seed=5)}


def _model(path, **kw):
    return LlamaCppModel(path, n_ctx=256, identity=None, n_threads=1, **kw)


def test_the_kept_tokens_are_the_most_frequent_plus_the_special_ones():
    counts = np.array([5, 0, 9, 9, 1, 7])
    np.testing.assert_array_equal(kept_tokens(counts, 3), [2, 3, 5])          # ties by id
    np.testing.assert_array_equal(kept_tokens(counts, 3, always=[1]), [2, 3, 1])
    with pytest.raises(SpecboundError, match="keep 1..6"):
        kept_tokens(counts, 7)


def test_logits_on_the_kept_rows_equal_the_full_drafts(files, cache):
    kept = np.arange(VOCAB)[::-1][: VOCAB // 2].copy()          # a subset, in another order
    full = _model(files["draft"])
    trimmed = TrimmedHeadModel(_model(trimmed_gguf(files["draft"], kept, progress=False), seed_tokenizer=False),
                               kept, VOCAB)
    assert trimmed.vocab_size == VOCAB and trimmed.inner.vocab_size == len(kept)
    ids = torch.tensor([kept[np.random.default_rng(0).integers(0, len(kept), 20)]])
    ours, theirs = trimmed.forward(ids)[0], full.forward(ids)[0]
    assert torch.equal(ours[:, kept], theirs[:, kept])
    others = np.setdiff1d(np.arange(VOCAB), kept)
    assert torch.all(torch.isneginf(ours[:, others]))
    trimmed.reset()
    outside = ids.clone()
    outside[0, 3] = int(others[0])                               # read as the fallback row
    assert not torch.equal(trimmed.forward(outside)[0][4:, kept], theirs[4:, kept])


def test_the_trimmed_copy_is_reused_and_rebuilt_when_damaged(files, cache, capsys):
    kept = np.arange(64)
    path = trimmed_gguf(files["draft"], kept, progress=False)
    stamp = path.stat().st_mtime_ns
    assert trimmed_gguf(files["draft"], kept, progress=False) == path and path.stat().st_mtime_ns == stamp
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert trimmed_gguf(files["draft"], kept, progress=False) == path
    assert "damaged" in capsys.readouterr().err and path.read_bytes() != bytes(data)


@pytest.mark.parametrize("kw", [{"gamma": 3}, {"gamma": "auto"}, {"tree": 6}])
def test_greedy_sd_with_a_trimmed_draft_is_the_targets_greedy(files, cache, kw):
    kept = kept_tokens(np.arange(VOCAB)[::-1].astype(np.int64), VOCAB * 3 // 4)
    target = _model(files["target"])
    draft = TrimmedHeadModel(_model(trimmed_gguf(files["draft"], kept, progress=False), seed_tokenizer=False),
                             kept, VOCAB)
    for seed, prompt in enumerate(([1, 5, 9], [1, 40, 41, 42])):
        plain = autoregressive_decode(target, prompt, 24, temperature=0.0).tokens
        assert speculative_decode(target, draft, prompt, 24, temperature=0.0, seed=seed, **kw).tokens == plain
    sampled = speculative_decode(target, draft, [1, 5, 9], 16, temperature=1.0, seed=3, gamma=3)
    assert len(sampled.tokens) == 16


class _CharIds:
    """A stand-in tokenizer over the tiny vocabulary: one id per character (``ord % VOCAB``)."""

    all_special_ids = [1]

    def __len__(self):
        return VOCAB

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % VOCAB for c in text]}


def test_load_trimmed_draft_keeps_the_most_frequent_tokens_and_the_special_ones(files, cache, monkeypatch):
    from specbound.models import trimmed

    monkeypatch.setattr(trimmed, "_shipped_text", lambda: ["aaaa bbb cc d " * 50])
    draft = trimmed.load_trimmed_draft(files["draft"], head=6, tokenizer=_CharIds(), vocab_size=VOCAB,
                                       identity="tiny", name="tiny-draft", progress=False, n_ctx=256, n_threads=1)
    counted = {ord(c) % VOCAB for c in "abcd "}
    assert counted | {1} <= set(draft.kept.tolist()) and draft.kept.numel() == 6
    target = _model(files["target"])
    for prompt in ([1, 5, 9], [1, 40, 41, 42]):
        plain = autoregressive_decode(target, prompt, 20, temperature=0.0).tokens
        assert speculative_decode(target, draft, prompt, 20, temperature=0.0, gamma="auto").tokens == plain


@pytest.mark.parametrize("head, message", [("0", "at least 1"), ("many", "'full' or a number"), (-3, "at least 1")])
def test_a_bad_draft_head_is_refused(head, message):
    from specbound.models.trimmed import check_draft_head

    with pytest.raises(SpecboundError, match=message):
        check_draft_head(head)
    assert check_draft_head("full") is None and check_draft_head("16384") == 16384


def test_a_trimmed_head_needs_the_draft_on_llama_cpp(monkeypatch):
    from specbound.models import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("loaded a model before the check"))
    with pytest.raises(SpecboundError, match="needs the draft on llama.cpp"):
        loading.load_pair(draft_engine="torch", draft_head=1024)


@pytest.mark.parametrize("extra", [["--draft-engine", "torch"], ["--draft", "none"]])
def test_generate_refuses_a_draft_head_without_a_llama_cpp_draft(extra, no_model_loads, capsys):
    from specbound.cli import main

    assert main(["generate", "--prompt", "x", "--target-precision", "int8", "--draft-head", "4096"] + extra) == 2
    assert "--draft-head trims a llama.cpp draft" in capsys.readouterr().err
