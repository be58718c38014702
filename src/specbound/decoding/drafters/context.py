"""Context drafter: each round proposes what followed the longest earlier occurrence of the context's
suffix (:class:`~specbound.decoding.context.ContextIndex`) — no draft model, no draft reads — cut where
the round's expected tokens per second peak (:func:`~specbound.theory.speedup.best_free_prefix`, with the
target's measured t(k) and each token's calibrated acceptance). A proposal is a function of the context
alone, a deterministic tree verified by the target walk: lossless at every temperature. With nothing
worth proposing the round is a plain step.
"""
from __future__ import annotations

import numpy as np
import torch

from ...theory.speedup import best_free_prefix
from ..context import ContextCalibration, ContextIndex
from ..costs import CostModel, load_or_measure_costs
from ..sampling import SamplingConfig
from ..tree import DraftTree
from .base import Drafter, RoundFeedback

__all__ = ["ContextDrafter", "ContextSource"]

#: Longest context proposal per round (a round reads it in one target pass)
MAX_CONTEXT_TOKENS = 32


class ContextSource:
    """The context index, the calibration of its tokens and, per round, the proposal and its best cut:
    what the context drafter drafts from and what a model drafter mixes in."""

    def __init__(self, *, max_tokens: int = MAX_CONTEXT_TOKENS):
        self.index = ContextIndex()
        self.calibration = ContextCalibration()
        self.max_tokens = max_tokens

    def plan(self, committed, limit: int, verify_seconds, fixed_seconds: float = 0.0):
        """(tokens, match, rates, predicted tokens/s) of this round's best context prefix (tokens empty:
        nothing worth proposing)."""
        self.index.sync(committed)
        proposal = self.index.propose(min(limit, self.max_tokens))
        if not proposal.tokens:
            return (), 0, [], 0.0
        rates = self.calibration.rates(proposal.match, len(proposal.tokens))
        keep, rate = best_free_prefix(rates, verify_seconds, fixed_seconds)
        return proposal.tokens[:keep], proposal.match, rates[:keep], rate

    def learn(self, tree: DraftTree, feedback: RoundFeedback) -> None:
        """Every read context node's acceptance given its proposed prefix: the target's probability of its
        token (the context nodes lead the chain)."""
        if feedback.node_target_probs is None or tree.from_context is None:
            return
        n = int(tree.from_context.sum())
        self.calibration.learn(tree.context_match, feedback.node_target_probs[:n].numpy().tolist())


class ContextDrafter(Drafter):
    """Drafts from the context only (see the module docstring): ``specbound generate --draft none``."""

    name = "context"

    def __init__(self, sampling: SamplingConfig):
        super().__init__(sampling)
        self.source = ContextSource()
        self.costs: CostModel | None = None

    def start(self, target, prompt):
        super().start(target, prompt)
        if self.costs is None:
            measurement = load_or_measure_costs(target, None)
            self.calibration_time = measurement.seconds
            self.costs = CostModel(measurement)

    def propose(self, committed, max_depth, generator):
        tokens, match, rates, _ = self.source.plan(committed, max_depth, self.costs.target)
        if not tokens:
            return DraftTree.empty()
        return DraftTree.chain(list(tokens), confidences=np.asarray(rates, dtype=np.float64),
                               from_context=torch.ones(len(tokens), dtype=torch.bool), context_match=match)

    def observe(self, feedback: RoundFeedback) -> None:
        self.costs.observe_target(feedback.target_tokens, feedback.target_seconds)
        if len(feedback.tree):
            self.source.learn(feedback.tree, feedback)

    def cost_model(self) -> CostModel | None:
        return self.costs
