"""Mixed backends: a torch target (fp32 or int8) fed by a draft on llama.cpp. The tiny GGUF is read by
both engines (transformers dequantises it, llama.cpp runs it), so target and draft share one
vocabulary; greedy SD must equal the torch target's own greedy decoding and sampled SD must follow
the torch target's law (χ², with a planted-bias check that the test can fail)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import chi_square_pvalue, encode, exact_first_two_law
from specbound.decoding import SamplingConfig, autoregressive_decode, speculative_decode
from specbound.errors import SpecboundError

pytestmark = pytest.mark.llamacpp          # needs the compiled llama-cpp-python binding
pytest.importorskip("gguf")
pytest.importorskip("llama_cpp")

from gguf_tiny import write_tiny_llama_gguf  # noqa: E402
from specbound.models.hf import HFModel  # noqa: E402
from specbound.models.int8 import quantize_int8  # noqa: E402
from specbound.models.llamacpp import LlamaCppModel  # noqa: E402
from specbound.models.loading import check_same_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    return {"target": write_tiny_llama_gguf(root / "target.gguf", seed=0),
            "draft": write_tiny_llama_gguf(root / "draft.gguf", seed=0, noise=0.3, noise_seed=5)}


def _torch_target(path, int8: bool) -> HFModel:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    if int8:
        quantize_int8(model)
    return HFModel(model, name="tiny-torch-target" + ("-int8" if int8 else ""))


@pytest.fixture(scope="module")
def draft(files):
    # ONE thread, as in test_llamacpp: two OpenMP threads on a shared 2-core machine spin (429 s vs 12 s seen)
    return LlamaCppModel(files["draft"], n_ctx=512, identity=None, name="tiny-llamacpp-draft", n_threads=1)


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("kw", [dict(gamma=3), dict(tree=6, tree_drafter="dynamic")])
def test_greedy_sd_with_a_llamacpp_draft_is_the_torch_targets_greedy(files, draft, int8, kw):
    target = _torch_target(files["target"], int8)
    assert target.vocab_size == draft.vocab_size
    accepted = 0
    for seed in range(3):
        prompt = torch.randint(3, target.vocab_size, (1, 6), generator=torch.Generator().manual_seed(seed))
        ref = autoregressive_decode(target, prompt, 24, temperature=0.0).tokens
        out = speculative_decode(target, draft, prompt, 24, temperature=0.0, seed=seed, **kw)
        assert out.tokens == ref
        accepted += sum(out.metrics.accepted_per_step)
    assert accepted > 0                     # the noisy copy agrees often: drafts were really accepted


@pytest.mark.montecarlo
@pytest.mark.slow
def test_sampled_sd_with_a_llamacpp_draft_follows_the_torch_targets_law(files, draft):
    """χ² of (x1, x2) over 1500 runs against the int8 torch target's exact law (p > 1e-3); the draft
    decoding alone, a sampler whose law differs from the target's, is rejected by the same test."""
    target = _torch_target(files["target"], int8=True)
    config = SamplingConfig(1.0, top_k=6)
    prompt = torch.tensor([[1, 60, 70, 80]])
    vocab = target.vocab_size
    law = exact_first_two_law(target, prompt, config, vocab=vocab)
    runs = 1500
    sd = np.array([speculative_decode(target, draft, prompt, 2, gamma=2, temperature=1.0, top_k=6, seed=i).tokens
                   for i in range(runs)])
    assert chi_square_pvalue(encode(sd, vocab), law) > 1e-3
    biased = np.array([autoregressive_decode(draft, prompt, 2, temperature=1.0, top_k=6, seed=i).tokens
                       for i in range(runs)])
    assert chi_square_pvalue(encode(biased, vocab), law) < 1e-3


class _Tok:
    def __init__(self, offset=0):
        self.offset = offset

    def __call__(self, text, add_special_tokens=True, **_):
        return {"input_ids": [ord(c) % 200 + self.offset for c in text]}

    def get_vocab(self):
        return {"a": 0}


def test_tokenizers_of_two_engines_are_compared_by_what_they_produce():
    class M:
        vocab_size = 304

        def __init__(self, tok, name):
            self.tokenizer, self.name = tok, name

    class Other(_Tok):
        pass

    check_same_tokenizer(M(_Tok(), "t"), M(Other(), "d"))           # same ids from different classes: fine
    with pytest.raises(SpecboundError, match="tokenizer mismatch"):
        check_same_tokenizer(M(_Tok(), "t"), M(Other(offset=1), "d"))
    wide = M(_Tok(), "d")
    wide.vocab_size = 305
    with pytest.raises(SpecboundError, match="vocabulary mismatch"):
        check_same_tokenizer(M(_Tok(), "t"), wide)


# ------------------------------------------------------------------ llama.cpp rows in a batch
BATCH_PROMPTS = [[1, 60, 70, 80, 90], [5, 9], [7, 30, 31, 32, 33, 34, 35, 36]]   # different lengths
BATCH_BUDGETS = [14, 9, 11]                                                       # and horizons


def _static_target(path):
    from transformers import AutoModelForCausalLM

    from specbound.models.static import StaticCacheHFModel

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    quantize_int8(model)
    return StaticCacheHFModel(model, name="tiny-torch-target-int8")


@pytest.mark.parametrize("temperature,gamma", [(0.0, 3), (0.9, 3), (0.0, "auto")])
def test_llamacpp_draft_rows_decode_each_request_as_alone(files, draft, temperature, gamma):
    """A torch target (its rows share passes) fed by llama.cpp draft rows (a context each, run in turn):
    every request's tokens equal the same request decoded alone, greedy and sampled (same seed: the
    draft's logits of a row are those it has alone, so the random streams line up too). With
    gamma="auto" each request sizes its own chain under the batch's draft-or-plain check (greedy: the
    tokens are the target's whatever is drafted)."""
    from specbound.decoding.batch import speculative_decode_batch

    target = _static_target(files["target"])
    kw = dict(gamma=gamma, temperature=temperature, top_k=None if temperature == 0 else 8)
    batch = speculative_decode_batch(target, draft, BATCH_PROMPTS, BATCH_BUDGETS, seed=40, **kw)
    draft_passes = [p for p in batch.passes if p.priority == 0]
    assert draft_passes and max(p.rows for p in draft_passes) == len(BATCH_PROMPTS)   # the draft's rows were scheduled
    accepted = 0
    for i, prompt in enumerate(BATCH_PROMPTS):
        alone = speculative_decode(target, draft, torch.tensor([prompt]), BATCH_BUDGETS[i], seed=40 + i, **kw)
        assert batch[i].tokens == alone.tokens, i
        accepted += sum(batch[i].metrics.accepted_per_step)
    if gamma != "auto":                     # auto may settle on plain rounds with these random tiny models
        assert accepted > 0


def test_llamacpp_rows_as_target_and_draft_decode_each_request_as_alone(files, draft):
    from specbound.decoding.batch import autoregressive_decode_batch, speculative_decode_batch

    target = LlamaCppModel(files["target"], n_ctx=256, identity=None, name="tiny-llamacpp-target", n_threads=1)
    batch = speculative_decode_batch(target, draft, BATCH_PROMPTS, BATCH_BUDGETS, gamma=2, temperature=0, seed=3)
    plain = autoregressive_decode_batch(target, BATCH_PROMPTS, BATCH_BUDGETS, temperature=0)
    for i, prompt in enumerate(BATCH_PROMPTS):
        alone = autoregressive_decode(target, torch.tensor([prompt]), BATCH_BUDGETS[i], temperature=0).tokens
        assert batch[i].tokens == alone and plain[i].tokens == alone, i


def test_llamacpp_rows_share_the_weights_and_outlive_the_model_they_came_from(files):
    model = LlamaCppModel(files["draft"], n_ctx=128, identity=None, n_threads=1)
    prompt = torch.tensor([[1, 60, 70]])
    reference = model.forward(prompt)
    row = model.fork()
    assert row._model is model._model and row._ctx is not None and row._ctx != model._ctx
    assert row.cache_length == 0 and model.cache_length == 3          # a cache of its own, empty
    model.close()                                                    # the weights stay while a row uses them
    torch.testing.assert_close(row.forward(prompt), reference, atol=1e-5, rtol=1e-5)
    other = row.fork()
    row.close()
    assert other.forward(prompt).shape == reference.shape
    other.close()
    with pytest.raises(SpecboundError, match="closed"):
        other.forward(prompt)
