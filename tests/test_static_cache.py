"""The static-cache Hugging Face backend (models/static.py) against the model's own forward:
the same logits for every sequence of chain reads, tree reads, keep_path and crop (Qwen2 and Llama
layouts, across a cache growth); bitwise batch invariance on an int8, batch-invariant model; a
clear refusal of layouts it does not read, and the fallback to HFModel for them."""
import pytest
import torch

from helpers import tiny_transformer
from specbound.errors import SpecboundError
from specbound.models.hf import HFModel
from specbound.models.static import StaticCacheHFModel, static_cache_unsupported, wrap_hf_model

VOCAB = 48


def tiny_llama(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=0.25, attention_bias=True)
    return LlamaForCausalLM(config).eval()


def _drive(models, seed: int, steps: int = 30):
    """Apply the same random operations to every model; return the largest logit difference seen."""
    gen = torch.Generator().manual_seed(seed)

    def rand(n, high):
        return torch.randint(0, high, (n,), generator=gen).tolist()

    worst = 0.0
    first = models[0]
    prompt = rand(20, VOCAB)
    for m in models:
        m.prefill(prompt)
    for _ in range(steps):
        op = rand(1, 4)[0]
        base = first.cache_length
        if op == 0 or not first.slots.is_chain and op == 3:       # a chain read (commits if no tree)
            tokens = torch.tensor([rand(1 + rand(1, 5)[0], VOCAB)])
            outs = [m.forward(tokens) for m in models]
        elif op in (1, 3):                                         # a tree read
            n = 1 + rand(1, 6)[0]
            parents = []
            for i in range(n):
                lo = first.committed_length - 1
                parents.append(lo + rand(1, base + i - lo)[0])
            tokens = torch.tensor([rand(n, VOCAB)])
            outs = [m.forward_tree(tokens, parents) for m in models]
        else:                                                      # keep a branch, or crop
            if not first.slots.is_chain:
                tip, committed = first.cache_length - 1, first.committed_length
                path = []
                while tip >= committed:
                    path.append(tip)
                    tip = first.slots.parents[tip - committed]
                for m in models:
                    m.keep_path(tip + 1, path[::-1])
            else:
                length = max(1, first.cache_length - rand(1, 4)[0])
                for m in models:
                    m.crop(length)
            continue
        worst = max(worst, max(float((o - outs[0]).abs().max()) for o in outs[1:]))
        assert len({m.cache_length for m in models}) == 1
    return worst


@pytest.mark.parametrize("build", [lambda: tiny_transformer(0, vocab=VOCAB), lambda: tiny_llama(1)],
                         ids=["qwen2", "llama"])
@pytest.mark.parametrize("seed", range(3))
def test_same_logits_as_the_models_own_forward(build, seed):
    model = build()
    worst = _drive([HFModel(model, name="dynamic"), StaticCacheHFModel(model, name="static")], seed)
    assert worst < 1e-5          # float32 attention either way; measured 0.0 on this machine


def test_cache_growth_keeps_earlier_slots():
    model = tiny_transformer(3, vocab=VOCAB)
    ref, static = HFModel(model, name="dynamic"), StaticCacheHFModel(model, name="static")
    prompt = torch.randint(0, VOCAB, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    for m in (ref, static):
        m.prefill(prompt[:200])
    assert static.capacity == 256
    out = [m.forward(torch.tensor([prompt[200:]])) for m in (ref, static)]     # grows to 512 slots
    assert static.capacity >= 300
    assert float((out[0] - out[1]).abs().max()) < 1e-5


def test_int8_invariant_model_reads_k_tokens_as_one_by_one():
    """Bitwise: verifying k drafted tokens in one pass gives each token the logits of one-token reads."""
    from specbound.models.int8 import int8_available, make_batch_invariant, quantize_int8

    if not int8_available():
        pytest.skip("fbgemm int8 kernels not available")
    model = make_batch_invariant(quantize_int8(tiny_transformer(4, vocab=VOCAB)))
    static = StaticCacheHFModel(model, name="int8")
    assert static.attention_dtype == torch.float64
    prompt = list(range(1, 17))
    tokens = [5, 9, 2, 33, 7, 1]
    static.prefill(prompt)
    together = static.forward(torch.tensor([tokens]))[0]
    static.crop(len(prompt))
    alone = torch.cat([static.forward(torch.tensor([[t]]))[0] for t in tokens])
    assert torch.equal(together, alone)
    static.crop(len(prompt))         # and a tree read of the same chain
    tree = static.forward_tree(torch.tensor([tokens]), list(range(len(prompt) - 1, len(prompt) + len(tokens) - 1)))[0]
    assert torch.equal(tree, alone)


def test_other_layouts_are_refused_with_a_reason_and_wrapped_by_hfmodel():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2)).eval()
    reason = static_cache_unsupported(gpt2)
    assert "gpt2" in reason
    with pytest.raises(SpecboundError, match="cannot use a static cache.*gpt2"):
        StaticCacheHFModel(gpt2, name="tiny-gpt2")
    wrapped = wrap_hf_model(gpt2, name="tiny-gpt2")
    assert type(wrapped) is HFModel
    assert type(wrap_hf_model(tiny_transformer(0, vocab=VOCAB))) is StaticCacheHFModel
    assert type(wrap_hf_model(tiny_transformer(0, vocab=VOCAB), static=False)) is HFModel
