"""The one token sampler (``decoding.sampling.sample_from``, inverse CDF in float64): draws follow
the given law (χ², fixed seeds), never a token of weight 0, k draws per row are independent, and the
χ² check here has the power to reject a sampler that is off by a little."""
from __future__ import annotations

import numpy as np
import torch

from helpers import chi_square_pvalue
from specbound.decoding.sampling import sample_from


def _np(w: torch.Tensor) -> np.ndarray:
    law = w.double().numpy()
    return law / law.sum()


def _law(seed: int, vocab: int = 40, zeros: int = 10) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(vocab, generator=g) ** 3
    w[torch.randperm(vocab, generator=g)[:zeros]] = 0.0         # tokens a top-k / top-p cut removed
    return w / w.sum()


def test_draws_follow_the_law_and_skip_zero_weight_tokens():
    law = _law(0)
    g = torch.Generator().manual_seed(1)
    draws = torch.cat([sample_from(law.expand(500, -1), g) for _ in range(40)]).numpy()  # 20 000 draws
    assert draws.shape == (20_000,)
    assert not np.isin(draws, np.flatnonzero(law.numpy() == 0)).any()
    # 20 000 draws over ≤ 30 cells: a correct sampler gives p ~ U(0, 1); 1e-3 fails once in 1000 seeds
    assert chi_square_pvalue(draws, _np(law)) > 1e-3


def test_unnormalised_weights_rows_and_several_draws_per_row():
    a, b = _law(2) * 7.0, _law(3, zeros=0) * 0.01
    g = torch.Generator().manual_seed(4)
    draws = sample_from(torch.stack([a, b]), g, 10_000)
    assert draws.shape == (2, 10_000)
    assert chi_square_pvalue(draws[0].numpy(), _np(a)) > 1e-3
    assert chi_square_pvalue(draws[1].numpy(), _np(b)) > 1e-3
    # independence of successive draws: pairs (x_i, x_{i+1}) follow the product law
    x = draws[1].numpy()
    pairs = x[:-1:2] * b.numel() + x[1::2]
    pb = _np(b)
    assert chi_square_pvalue(pairs, np.outer(pb, pb).ravel()) > 1e-3


def test_a_point_mass_and_a_last_token_are_drawn_exactly():
    g = torch.Generator().manual_seed(5)
    one = torch.zeros(30)
    one[17] = 1.0
    assert set(sample_from(one.expand(200, -1), g).tolist()) == {17}
    last = torch.zeros(30)
    last[-1] = 1e-30                                     # total so small that u · total may round up to it
    assert set(sample_from(last.expand(200, -1), g).tolist()) == {29}
    tail = torch.zeros(30)
    tail[3] = 1.0                                         # zero weights after the last positive token
    assert set(sample_from(tail.expand(200, -1), g).tolist()) == {3}


def test_the_chi_square_check_rejects_a_slightly_biased_sampler():
    """The same check against a sampler that moves 3% of the mass from one token to another: it must
    fail (power), or the passing tests above would say nothing."""
    law = _law(0)
    biased = law.clone()
    i, j = int(torch.argmax(law)), int(torch.argsort(law)[-2])
    biased[i] -= 0.03
    biased[j] += 0.03
    g = torch.Generator().manual_seed(1)
    draws = torch.cat([sample_from(biased.expand(500, -1), g) for _ in range(40)]).numpy()
    assert chi_square_pvalue(draws, _np(law)) < 1e-3


def _nucleus_by_full_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Reference: sort the whole vocabulary, keep the smallest prefix whose mass reaches top_p."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    keep_sorted = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) < top_p
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)


def test_top_p_from_the_head_of_the_order_equals_a_full_sort():
    """The nucleus found by sorting only the most probable tokens (64, 512, … of them) is the one a
    full sort finds — for peaked rows (found in the first 64) and flat rows (needing the whole order)."""
    from specbound.decoding.sampling import _outside_top_p

    g = torch.Generator().manual_seed(6)
    for scale in (0.05, 1.0, 4.0, 12.0):                 # from nearly uniform to one dominant token
        logits = torch.randn(3, 20_000, generator=g, dtype=torch.float64) * scale
        probs = torch.softmax(logits, dim=-1)
        for top_p in (0.1, 0.5, 0.9, 0.999):
            kept = ~_outside_top_p(probs, top_p)
            assert torch.equal(kept, _nucleus_by_full_sort(probs, top_p)), (scale, top_p)
            assert bool((probs * kept).sum(-1).ge(top_p - 1e-12).all())
