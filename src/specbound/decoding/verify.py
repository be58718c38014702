"""THE verification core: pure tensor functions, no model calls (Yin et al. 2024, Alg. 1 and 2).

Vocabulary (as in vLLM's rejection sampler): a drafted token is *accepted* with probability
b = min(1, target/draft); the first rejected position gets a *recovered* token drawn from the
residual [target − b·draft]_+ (normalised); when every drafted token is accepted the target's law
after the last one gives a free *bonus* token. Every engine (chain, batch, tree) calls these
functions; none re-implements acceptance. The NumPy twins in :mod:`specbound.theory` hold the same
formulas for exact expectations and are cross-checked in the tests.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["AcceptanceRule", "ChainVerdict", "acceptance_probability", "residual_distribution", "verify_chain"]


def acceptance_probability(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                           tokens: torch.Tensor) -> torch.Tensor:
    """b(x) = min(1, target(x)/draft(x)) at the drafted tokens x (Yin et al. 2024, Alg. 1).

    ``target_probs``/``draft_probs`` are [..., V]; ``tokens`` is [...] and was sampled from
    ``draft_probs``, so draft(x) > 0 and nothing divides by zero.
    """
    t = target_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    d = draft_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.where(d > 0, (t / d.clamp_min(torch.finfo(d.dtype).tiny)).clamp(max=1.0), torch.ones_like(t))


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                          accept: torch.Tensor | None = None) -> torch.Tensor:
    """[target − b·draft]_+ normalised; b = min(1, target/draft) when ``accept`` is None.

    Same formula as :func:`specbound.theory.residual` (standard SD, the unbiased family of Thm 2,
    and the optimal residual P* of Thm 4). Rows with no positive mass fall back to the target.
    """
    if accept is None:
        excess = (target_probs - draft_probs).clamp_min(0)
    else:
        excess = (target_probs - accept * draft_probs).clamp_min(0)
    mass = excess.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, excess / mass.clamp_min(torch.finfo(excess.dtype).tiny), target_probs)


class AcceptanceRule:
    """A member of the rejection-based family (Yin et al. 2024, Alg. 2): acceptance b, resampling law.

    The default methods are standard speculative decoding. Subclasses override :meth:`acceptance`
    (full-vocabulary b, [..., V]) and, if needed, :meth:`resample_law`; ``lossless`` says whether the
    output law is the target's (b ≤ min(1, target/draft) with the residual resampling law).
    """

    lossless: bool = True
    name: str = "standard"

    def acceptance(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
        ratio = target_probs / draft_probs.clamp_min(torch.finfo(draft_probs.dtype).tiny)
        return torch.where(draft_probs > 0, ratio.clamp(max=1.0), torch.ones_like(ratio))

    def resample_law(self, target_probs, draft_probs, accept) -> torch.Tensor:
        return residual_distribution(target_probs, draft_probs, accept)


STANDARD = AcceptanceRule()


@dataclass
class ChainVerdict:
    """Outcome of verifying one drafted chain per row."""

    accepted: torch.Tensor       # [B] number of drafted tokens accepted (a prefix of the draft)
    next_token: torch.Tensor     # [B] recovered or bonus token; -1 when none (no bonus law given)
    rejected: torch.Tensor       # [B] bool: a drafted token was rejected (next_token is recovered)


def verify_chain(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                 generator: torch.Generator | None = None, rule: AcceptanceRule = STANDARD) -> ChainVerdict:
    """Speculative verification of one chain per row (Leviathan et al. 2023; Yin et al. 2024, Alg. 1).

    draft_tokens [B, k]; draft_probs [B, k, V] (the processed laws they were sampled from);
    target_probs [B, k, V] or [B, k+1, V] (processed target laws before each drafted token and, if
    given, after the last one, for the bonus token). ``rule`` swaps in another member of the
    rejection-based family; the default (standard SD) only evaluates b at the drafted tokens.
    """
    batch, k = draft_tokens.shape
    rows = torch.arange(batch)
    if rule is STANDARD:
        ratio = acceptance_probability(target_probs[:, :k], draft_probs, draft_tokens)
    else:
        accept_all = rule.acceptance(target_probs[:, :k], draft_probs)          # [B, k, V]
        ratio = accept_all.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    uniforms = torch.rand(ratio.shape, generator=generator, dtype=ratio.dtype)
    accepted = (uniforms < ratio).to(torch.long).cumprod(dim=-1).sum(dim=-1)
    rejected = accepted < k
    has_bonus = target_probs.shape[1] > k

    at = accepted.clamp(max=k - 1)
    if rule is STANDARD:
        recovered_law = residual_distribution(target_probs[rows, at], draft_probs[rows, at])
    else:
        recovered_law = rule.resample_law(target_probs[rows, at], draft_probs[rows, at], accept_all[rows, at])
    if has_bonus:
        law = torch.where(rejected.unsqueeze(-1), recovered_law, target_probs[:, k])
        next_token = torch.multinomial(law, 1, generator=generator).squeeze(-1)
    else:
        next_token = torch.full((batch,), -1, dtype=torch.long)
        if rejected.any():
            drawn = torch.multinomial(recovered_law, 1, generator=generator).squeeze(-1)
            next_token = torch.where(rejected, drawn, next_token)
    return ChainVerdict(accepted=accepted, next_token=next_token, rejected=rejected)
