"""Shape drafter (``shape="auto"``): each round drafts ONE of several shapes, chosen online.

At T > 0 three shapes compete: the chain (γ sized every round by its
:class:`~specbound.decoding.policy.DraftBudget`, block-verified under ``verification="auto"``), M = 2
i.i.d. drafts of length L (Yin et al. 2024, Alg. 4, batch design B) and a sampled tree of 2L nodes
(branching 2, 2, 1; recursive rejection over siblings), where L is the chain's recent drafted length,
so the three put comparable work in front of the target. A :class:`~specbound.decoding.policy.ShapeChoice`
picks the shape with the highest predicted tokens per second from the shapes' own rounds (their exact
expected accepted tokens given what they drafted, and their measured wall time). At T = 0 only the
chain runs (the dynamic tree is ``tree="auto"``). Each round is verified by the rule of its own shape,
and which shape drafts a round depends only on rounds already verified: the output law is the target's.
"""
from __future__ import annotations

import time

import numpy as np

from ...models.base import LanguageModel
from ...errors import SpecboundError
from ...theory.rejections import sampled_tree_value
from ..policy import ShapeChoice
from ..sampling import SamplingConfig
from .base import Drafter, RoundFeedback
from .batch import BatchDrafter
from .chain import ChainDrafter
from .trees import SampledTreeDrafter

__all__ = ["SHAPES", "ShapeDrafter", "check_shape"]

SHAPES = ("fixed", "auto")


def check_shape(shape) -> str:
    """``shape``: None or "fixed" (the keywords gamma / tree / drafts say what to draft), "auto" (the
    shape is chosen every round, :class:`ShapeDrafter`)."""
    if shape is None:
        return "fixed"
    if shape not in SHAPES:
        raise SpecboundError(f"shape must be 'fixed' or 'auto', got {shape!r}")
    return shape


def drafted_value(feedback: RoundFeedback) -> float:
    """E[X | the round's drafted tree]: the expected accepted drafted tokens given what was drafted, the
    verifier's coins integrated out — Σ_i P(τ ≥ i) from the block rule's exact stop probabilities, else
    :func:`~specbound.theory.sampled_tree_value` (recursive rejection; a chain is its fan-out-1 case)
    on the round's target laws; the accepted count itself where the laws are not all read (the last
    round before the budget)."""
    tree, verdict = feedback.tree, feedback.verdict
    if not len(tree):
        return 0.0
    block = verdict.block_accept_probs
    if block is not None and len(block) == len(tree):
        return float(np.cumprod(np.asarray(block, dtype=np.float64)).sum())
    if not tree.sampled or feedback.target_laws is None:
        return float(verdict.accepted)
    return sampled_tree_value(parents=tree.parents.numpy(), tokens=tree.tokens.numpy(),
                              target=feedback.target_laws.double().numpy(), draft=tree.draft_probs.double().numpy())


class ShapeDrafter(Drafter):
    """Chain, M = 2 drafts or a sampled tree per round, whichever is predicted fastest (:class:`ShapeChoice`)."""

    name = "shape"
    mixed_shapes = True

    def __init__(self, model: LanguageModel, sampling: SamplingConfig, choice: ShapeChoice | None = None,
                 length: float = 4.0):
        super().__init__(sampling)
        self.chain = ChainDrafter(model, sampling, "auto")
        self.model = model
        self.shapes: dict[str, Drafter] = {"chain": self.chain}
        if not sampling.greedy:
            if not model.supports_trees:
                raise SpecboundError(f"shape='auto' drafts trees at T > 0, and {model.name} does not implement "
                                     "forward_tree/keep_path (use gamma='auto' for chains only)")
            self.shapes["drafts"] = BatchDrafter(model, sampling, 2, 4)
            self.shapes["sampled"] = SampledTreeDrafter(model, sampling, 8, branching=(2, 2, 1))
        self.needs_tree_target = len(self.shapes) > 1
        self.choice = choice if choice is not None else ShapeChoice(list(self.shapes))
        if list(self.choice.names) != list(self.shapes):
            raise SpecboundError(f"the shape choice must rank {list(self.shapes)}, got {self.choice.names}")
        self.length = float(length)           # recency-weighted mean drafted length of the chain's rounds
        self.cache = self.chain.cache         # the cache of the shape that proposed last (analyses read its reads)

    def start(self, target, prompt):
        self.chain.start(target, prompt)
        self.calibration_time = self.chain.calibration_time

    def cost_model(self):
        return self.chain.cost_model()

    def propose(self, committed, max_depth, generator):
        name = self.choice.choose()
        drafter = self.shapes[name]
        length = max(2, int(round(self.length)))
        if name == "drafts":
            drafter.gamma = length
        elif name == "sampled":
            drafter.capacity = 2 * length
        self.cache = drafter.cache
        tree = drafter.propose(committed, max_depth, generator)
        tree.shape = name
        return tree

    def observe(self, feedback: RoundFeedback) -> None:
        """The proposing shape keeps its path and learns; the choice records the round: 1 + E[X | its
        drafted tree] tokens in the round's measured seconds (drafting, the target pass, verification and
        this scoring; the loop's own bookkeeping is the same whatever the shape)."""
        t0 = time.perf_counter()
        tree = feedback.tree
        name = tree.shape or "chain"
        self.shapes[name].observe(feedback)
        if name == "chain" and len(tree):
            self.length = 0.8 * self.length + 0.2 * len(tree)
        if len(self.shapes) > 1:
            tokens = 1.0 + drafted_value(feedback)
            seconds = feedback.draft_seconds + feedback.target_seconds + feedback.verify_seconds
            self.choice.record(name, tokens, seconds + time.perf_counter() - t0)

    def abandon(self) -> None:
        self.cache.restore()

    def describe(self) -> str:
        if len(self.shapes) == 1:
            return "shape(auto: chain(γ=auto) at T = 0)"
        used = ", ".join(f"{n} {self.choice.chosen[n]}" for n in self.shapes)
        return f"shape(auto: chain(γ=auto) | 2 drafts × L | sampled tree 2L; rounds {used})"
