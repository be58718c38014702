"""Chain drafter: γ tokens sampled one by one from the draft model (Leviathan et al. 2023;
Yin et al. 2024, Alg. 1). A chain is a draft tree of fan-out 1, verified by the sampled-chain rule.

γ is fixed (an int), drafted to the generation horizon (``None``, Yin's setting: every round but the
last ends at a rejection), or chosen every round by a sizing policy (``"auto"``: the cost model of
:mod:`specbound.theory.speedup` with measured costs; γ = 0 is a plain target step).
"""
from __future__ import annotations

import time

import torch

from ...errors import SpecboundError
from ...models.base import LanguageModel
from ..policy import AdaptiveGamma
from ..sampling import SamplingConfig, logits_to_probs, sample_from
from ..tree import DraftTree
from .base import DraftCache, Drafter, RoundFeedback

__all__ = ["ChainDrafter", "check_gamma"]


def check_gamma(gamma):
    """γ: an integer ≥ 1, None (to the horizon), "auto" or an :class:`AdaptiveGamma` policy."""
    if gamma is None or gamma == "auto" or isinstance(gamma, AdaptiveGamma):
        return gamma
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise SpecboundError(f"gamma (draft length) must be an integer >= 1, None or 'auto', got {gamma!r}")
    return gamma


class ChainDrafter(Drafter):
    """Samples a chain of γ tokens from the draft's processed law (the law it records for verification)."""

    name = "chain"

    def __init__(self, model: LanguageModel, sampling: SamplingConfig, gamma=None):
        super().__init__(sampling)
        if not isinstance(model, LanguageModel):
            raise SpecboundError(f"the chain drafter needs a draft LanguageModel, got {type(model).__name__}")
        self.model, self.gamma = model, check_gamma(gamma)
        self.policy: AdaptiveGamma | None = gamma if isinstance(gamma, AdaptiveGamma) else None
        self.cache = DraftCache(model)
        self._seconds_per_token: float | None = None

    def start(self, target, prompt):
        super().start(target, prompt)
        if self.gamma == "auto":
            self.policy = AdaptiveGamma.calibrate(target, self.model)

    def draft_length(self, max_depth: int) -> int:
        if self.policy is not None:
            return self.policy.choose(max_depth)
        return max_depth if self.gamma is None else min(self.gamma, max_depth)

    def propose(self, committed, max_depth, generator):
        k = self.draft_length(max_depth)
        if k == 0:
            return DraftTree.empty()
        logits = self.cache.start(committed)
        t0 = time.perf_counter()
        tokens, laws = [], []
        for i in range(k):
            probs = logits_to_probs(logits, self.sampling, self.model.name)
            tokens.append(int(sample_from(probs, generator)))
            laws.append(probs)
            if i < k - 1:
                logits = self.cache.read([i], [tokens[-1]], [i - 1])[0]
        self._seconds_per_token = (time.perf_counter() - t0) / (k - 1) if k > 1 else None
        return DraftTree.chain(tokens, torch.stack(laws), draft_calls=self.cache.calls)

    def observe(self, feedback: RoundFeedback) -> None:
        if len(feedback.tree):
            self.cache.keep(feedback.verdict.path)
        if self.policy is not None:
            self.policy.observe(len(feedback.tree), feedback.verdict.accepted, self._seconds_per_token,
                                feedback.target_seconds)

    def describe(self) -> str:
        g = "auto" if self.policy is not None else ("horizon" if self.gamma is None else self.gamma)
        return f"chain(γ={g})"
