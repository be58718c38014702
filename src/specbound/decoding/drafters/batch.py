"""Batch drafter: M i.i.d. draft sequences per round as M root branches (Yin et al. 2024, Alg. 4, Thm 3).

One draft call per depth: the root law, then the M nodes of each depth read together under their
parents (the cache attaches under cached nodes, so nothing is re-read). Verification is the sampled
tree rule: recursive rejection over the M first tokens at the round start, then Alg. 1 along the
accepted branch — design B, whose exact rejections are :func:`specbound.theory.batch_expected_rejections`
(Thm 3, Prop. 1). Design A (``design="A"``, a derived variant, not the paper's statement) pools, at
every position, the candidates of all branches that agree with the accepted prefix.
"""
from __future__ import annotations

import torch

from ...errors import SpecboundError, positive_int
from ...models.base import LanguageModel
from ..sampling import SamplingConfig, logits_to_probs, sample_from
from ..tree import DraftTree
from .base import DraftCache, Drafter, RoundFeedback

__all__ = ["BATCH_DESIGNS", "BatchDrafter", "check_batch_gamma", "check_design", "check_drafts"]

BATCH_DESIGNS = ("A", "B")


def check_drafts(drafts) -> int:
    """M (number of i.i.d. draft sequences per round): an integer ≥ 1; None means 1 (chain SD)."""
    return 1 if drafts is None else positive_int(drafts, "drafts (number of draft sequences per round)")


def check_batch_gamma(gamma):
    """γ for batch SD: an integer ≥ 1 (branch length) or None (to the horizon); "auto" is not offered."""
    if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1):
        raise SpecboundError(f"gamma (draft length) must be an integer >= 1 or None for batch SD, got {gamma!r}")
    return gamma


def check_design(design) -> str:
    key = design.upper() if isinstance(design, str) else design
    if key not in BATCH_DESIGNS:
        raise SpecboundError(f"design must be 'A' (prefix-tree walk) or 'B' (branch at the round start, default), "
                             f"got {design!r}")
    return key


class BatchDrafter(Drafter):
    """M sampled branches of length γ (or to the horizon when γ is None)."""

    name = "batch"

    needs_tree_target = True

    def __init__(self, model: LanguageModel, sampling: SamplingConfig, drafts: int, gamma: int | None = None,
                 design: str = "B"):
        super().__init__(sampling)
        if not isinstance(model, LanguageModel):
            raise SpecboundError(f"the batch drafter needs a draft LanguageModel, got {type(model).__name__}")
        if not model.supports_trees:
            raise SpecboundError(f"{model.name} does not implement forward_tree/keep_path, which batch speculative "
                                 "decoding needs (use drafts=None for chain speculative decoding)")
        self.model, self.gamma = model, check_batch_gamma(gamma)
        self.drafts, self.design = check_drafts(drafts), check_design(design)
        self.cache = DraftCache(model)

    def propose(self, committed, max_depth, generator):
        m = self.drafts
        k = max_depth if self.gamma is None else min(self.gamma, max_depth)
        root = logits_to_probs(self.cache.start(committed), self.sampling, self.model.name)
        laws = root.new_zeros(m, k, root.shape[-1])
        tokens = torch.empty((m, k), dtype=torch.long)
        laws[:, 0] = root
        tokens[:, 0] = sample_from(root.expand(m, -1), generator)
        for d in range(1, k):
            nodes = [(d - 1) * m + i for i in range(m)]
            parents = [n - m if d > 1 else -1 for n in nodes]
            logits = self.cache.read(nodes, tokens[:, d - 1].tolist(), parents)
            laws[:, d] = logits_to_probs(logits, self.sampling, self.model.name)
            tokens[:, d] = sample_from(laws[:, d], generator)
        return DraftTree.branches(tokens, laws, pool_equal_prefixes=self.design == "A", draft_calls=self.cache.calls)

    def observe(self, feedback: RoundFeedback) -> None:
        self.cache.keep(feedback.verdict.path)

    def describe(self) -> str:
        return f"batch(M={self.drafts}, design {self.design}, γ={'horizon' if self.gamma is None else self.gamma})"
