"""A draft's GGUF re-quantised once into the cache (models/requant.py): built, reused, rebuilt when the
cached copy is wrong, refused clearly on bad input, and — since the draft only proposes — greedy SD
with the re-quantised draft is still the torch target's own greedy decoding."""
from __future__ import annotations

import json

import pytest
import torch

from specbound.decoding import autoregressive_decode, speculative_decode
from specbound.errors import SpecboundError

pytestmark = pytest.mark.llamacpp
pytest.importorskip("gguf")
pytest.importorskip("llama_cpp")

from gguf_tiny import write_tiny_llama_gguf  # noqa: E402
from specbound.assets.cache import MANIFEST_FILE  # noqa: E402
from specbound.models.hf import HFModel  # noqa: E402
from specbound.models.llamacpp import LlamaCppModel  # noqa: E402
from specbound.models.requant import requantized_dir, requantized_gguf  # noqa: E402


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("requant")
    return {"target": write_tiny_llama_gguf(root / "target.gguf", seed=0),
            "draft": write_tiny_llama_gguf(root / "draft.gguf", seed=0, noise=0.3, noise_seed=5)}


def _model(path):
    return LlamaCppModel(path, n_ctx=256, identity=None, n_threads=1)


def test_builds_a_q4_0_copy_once_and_reuses_it(files, cache):
    path = requantized_gguf(files["draft"], "q4_0", progress=False)
    assert path.is_file() and path.is_relative_to(cache)
    assert path.parent == requantized_dir(files["draft"], "q4_0")
    assert path.stat().st_size < files["draft"].stat().st_size / 4      # f32 → ~4.5 bits per weight
    model = _model(path)
    assert "Q4_0" in model.info.kernels
    logits = model.forward(torch.tensor([[5, 6, 7]]))
    assert torch.isfinite(logits).all()
    stamp = path.stat().st_mtime_ns
    assert requantized_gguf(files["draft"], "q4_0", progress=False) == path
    assert path.stat().st_mtime_ns == stamp                              # read, not rebuilt


def test_a_damaged_or_foreign_copy_is_rebuilt(files, cache, capsys):
    path = requantized_gguf(files["draft"], "q4_0", progress=False)
    size = path.stat().st_size
    with open(path, "r+b") as fh:                                       # truncated
        fh.truncate(size // 2)
    assert requantized_gguf(files["draft"], "q4_0", progress=False) == path
    assert path.stat().st_size == size
    assert "damaged" in capsys.readouterr().err
    good = path.read_bytes()
    with open(path, "r+b") as fh:                                       # 4 KB flipped in the middle, same size
        fh.seek(size // 2)
        fh.write(bytes(b ^ 0xFF for b in good[size // 2:size // 2 + 4096]))
    assert requantized_gguf(files["draft"], "q4_0", progress=False) == path
    assert "sha256 is" in capsys.readouterr().err and path.read_bytes() == good
    manifest = path.parent / MANIFEST_FILE                               # made from another file
    record = json.loads(manifest.read_text())
    record["info"]["source_sha256"] = "0" * 64
    manifest.write_text(json.dumps(record))
    requantized_gguf(files["draft"], "q4_0", progress=False)
    assert json.loads(manifest.read_text())["info"]["source_sha256"] != "0" * 64
    manifest.write_text("{not json")                                    # unreadable manifest
    requantized_gguf(files["draft"], "q4_0", progress=False)
    assert json.loads(manifest.read_text())["info"]["quant"] == "q4_0"
    assert not [p for p in path.parent.parent.iterdir() if p.name.startswith(".")]   # no staging left


def test_bad_input_is_refused_by_name(files, cache, tmp_path):
    assert requantized_gguf(files["draft"], "file") == files["draft"]
    with pytest.raises(SpecboundError, match="draft quantisation must be one of"):
        requantized_gguf(files["draft"], "q3_k")
    with pytest.raises(SpecboundError, match="no GGUF file"):
        requantized_gguf(tmp_path / "missing.gguf", "q4_0")
    assert not cache.exists() or not any(cache.rglob("*.gguf"))


def test_greedy_sd_with_the_requantized_draft_is_the_targets_greedy(files, cache):
    from transformers import AutoModelForCausalLM

    path = files["target"]
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    target = HFModel(hf, name="tiny-torch-target")
    draft = _model(requantized_gguf(files["draft"], "q4_0", progress=False))
    accepted = 0
    for seed in range(3):
        prompt = torch.randint(3, target.vocab_size, (1, 6), generator=torch.Generator().manual_seed(seed))
        plain = autoregressive_decode(target, prompt, 24, temperature=0.0).tokens
        for kw in (dict(gamma=3), dict(tree=6)):
            out = speculative_decode(target, draft, prompt, 24, temperature=0.0, **kw)
            assert out.tokens == plain
            accepted += sum(out.metrics.accepted_per_step)
    assert accepted > 0                     # the q4_0 copy of the noisy draft still agrees at times


def test_a_draft_opened_with_the_draft_context_keeps_greedy_sd_the_targets_greedy(files, cache):
    """``load_gguf_model(role="draft")`` opens the draft with f16 K/V, 64-token batches and the file read:
    its proposals may change, the output may not (greedy SD = the target's greedy decoding, trees too)."""
    from specbound.models.loading import load_gguf_model

    with pytest.raises(SpecboundError, match="role must be"):
        load_gguf_model(files["draft"], progress=False, role="drafter")
    draft = load_gguf_model(files["draft"], progress=False, role="draft")
    assert draft.n_batch == 64 and "K/V f16" in draft.info.kernels
    target = _model(files["target"])
    assert "K/V" not in target.info.kernels                       # a target keeps the f32 defaults
    for seed in range(2):
        prompt = torch.randint(3, target.vocab_size, (1, 70), generator=torch.Generator().manual_seed(seed))
        plain = autoregressive_decode(target, prompt, 20, temperature=0.0).tokens
        for kw in (dict(gamma=4), dict(tree=24)):                 # a 70-token prompt: two 64-token decodes
            assert speculative_decode(target, draft, prompt, 20, temperature=0.0, **kw).tokens == plain
