"""Prepacked (oneDNN) linear layers: equal to eager F.linear within float32 rounding, per layer and
for whole tiny transformers; greedy speculative decoding through them token-identical to eager."""
import copy

import pytest
import torch
from torch import nn

from helpers import hf_greedy_tokens, tiny_pair, tiny_transformer
from specbound.decoding import speculative_decode
from specbound.models.fast import PrepackedLinear, prepack_available, prepack_linears
from specbound.models.hf import HFModel

pytestmark = pytest.mark.skipif(not prepack_available(), reason="oneDNN not available")


@pytest.mark.parametrize("k", [1, 2, 3, 8, 17, 64])
@pytest.mark.parametrize("bias", [True, False])
def test_prepacked_linear_equals_eager(k, bias):
    torch.manual_seed(k)
    layer = nn.Linear(96, 200, bias=bias)
    x = torch.randn(2, k, 96)
    ref = torch.nn.functional.linear(x, layer.weight, layer.bias)
    out = PrepackedLinear(layer)(x)
    assert out.shape == ref.shape
    # float32 rounding: 96-term dot products of O(1) values, ~1e-6 relative
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_whole_model_logits_match_eager():
    eager = tiny_transformer(0, vocab=64, layers=3)
    fast = copy.deepcopy(eager)
    assert prepack_linears(fast) == 3 * 7 + 1          # q,k,v,o,gate,up,down per layer + lm_head
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(fast(input_ids=ids).logits, eager(input_ids=ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("gamma", [2, 5])
def test_greedy_sd_through_fast_path_is_token_identical_to_eager_target(gamma):
    eager_target, draft = tiny_pair(3, 48, noise=0.3, draft_seed=4)
    fast_target, fast_draft = copy.deepcopy(eager_target), copy.deepcopy(draft)
    prepack_linears(fast_target)
    prepack_linears(fast_draft)
    prompt = [5, 9, 13, 2]
    ref = hf_greedy_tokens(eager_target, torch.tensor([prompt]), 40)
    out = speculative_decode(HFModel(fast_target), HFModel(fast_draft), prompt, 40, gamma=gamma, temperature=0.0)
    assert out.tokens == ref
