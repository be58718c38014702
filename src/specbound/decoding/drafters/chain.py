"""Chain drafter: tokens sampled one by one from the draft model (Leviathan et al. 2023;
Yin et al. 2024, Alg. 1). A chain is a draft tree of fan-out 1, verified by the sampled-chain rule
(at temperature 0 the arg-max chain is a deterministic tree, verified by the target walk — the same
decisions, without one-hot draft laws).

The length is fixed (γ, an int), drafted to the generation horizon (``None``, Yin's setting: every
round but the last ends at a rejection), or sized every round by a
:class:`~specbound.decoding.policy.DraftBudget` (``"auto"``): drafting goes on while the next
token's predicted value (the path's calibrated acceptance probability) pays for its draft read and
for the larger target pass, and the chain is then cut where the expected tokens per second peak.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ...errors import SpecboundError
from ...models.base import LanguageModel
from ..policy import BatchDraftLength, DraftBudget
from ..sampling import SamplingConfig, check_logits, logits_to_probs, sample_from, token_probability
from ..tree import DraftTree
from .base import DraftCache, Drafter, RoundFeedback
from .context import ContextSource

__all__ = ["ChainDrafter", "check_gamma", "confidence_config"]


def check_gamma(gamma):
    """γ: an integer ≥ 1, None (to the horizon), "auto", a :class:`DraftBudget` or (batched requests) a
    :class:`BatchDraftLength`."""
    if gamma is None or gamma == "auto" or isinstance(gamma, (DraftBudget, BatchDraftLength)):
        return gamma
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise SpecboundError(f"gamma (draft length) must be an integer >= 1, None or 'auto', got {gamma!r}")
    return gamma


def confidence_config(sampling: SamplingConfig) -> SamplingConfig:
    """The law whose probability of a token is the draft's confidence in it: the processed law, or
    at temperature 0 (one-hot) the temperature-1 law with the same top-k/top-p."""
    return SamplingConfig(1.0, sampling.top_k, sampling.top_p) if sampling.greedy else sampling


class ChainDrafter(Drafter):
    """Samples a chain from the draft's processed law (the law it records for verification)."""

    name = "chain"

    def __init__(self, model: LanguageModel, sampling: SamplingConfig, gamma=None, *,
                 shared: BatchDraftLength | None = None, context: bool = False):
        """``shared``: the batch policy whose per-round length (or limit, with ``gamma="auto"``) this
        request drafts under; by default ``gamma`` itself when it is one. ``context`` (with ``gamma="auto"``,
        one request): a round may draft from the context instead (:meth:`_context_round`)."""
        super().__init__(sampling)
        if not isinstance(model, LanguageModel):
            raise SpecboundError(f"the chain drafter needs a draft LanguageModel, got {type(model).__name__}")
        self.model, self.gamma = model, check_gamma(gamma)
        self.budget: DraftBudget | None = gamma if isinstance(gamma, DraftBudget) else None
        if shared is None and isinstance(gamma, BatchDraftLength):
            shared = gamma
        self.shared: BatchDraftLength | None = shared
        self.rounds = 0
        self.cache = DraftCache(model, chain_only=True)
        self.confidence = confidence_config(sampling)
        self.context = ContextSource() if context and gamma == "auto" and shared is None else None

    def start(self, target, prompt):
        super().start(target, prompt)
        if self.gamma == "auto" and self.budget is None:
            self.budget = DraftBudget(self.calibrated_costs(target))

    def propose(self, committed, max_depth, generator):
        t0 = time.perf_counter()
        probe = 0
        if self.shared is not None:              # batched requests: the batch's length for this round
            self.rounds += 1
            limit = min(max_depth, self.shared.gamma_for_round(self.rounds))
            if limit == 0:
                return DraftTree.empty()
            if self.budget is not None:          # ... or a drafting round whose length this request sizes
                if not self.budget.start(pending=1):
                    return DraftTree.empty()
                if self.budget.exploring:
                    probe = limit = min(limit, self.budget.probe_size())
        elif self.budget is not None:
            limit = min(max_depth, self.budget.max_depth, self.budget.max_nodes)
            if self.context is not None:
                tree = self._context_round(committed, limit)
                if tree is not None:
                    return tree
            if not self.budget.start(pending=1):
                return DraftTree.empty()
            if self.budget.exploring:
                probe = limit = min(limit, self.budget.probe_size())
        else:
            limit = max_depth if self.gamma is None else min(self.gamma, max_depth)
        logits = self.cache.start(committed)
        greedy = self.sampling.greedy
        tokens, laws, conf, values = [], [], [], []
        while True:
            if greedy:      # the arg-max chain is a deterministic tree: no draft law needed to verify it
                top, index = logits.max(dim=-1)
                if not bool(torch.isfinite(top)):
                    check_logits(logits, self.model.name)
                token = int(index)
            else:
                probs = logits_to_probs(logits, self.sampling, self.model.name)
                token = int(sample_from(probs, generator))
                laws.append(probs)
            tokens.append(token)
            if self.budget is not None or (self.shared is not None and greedy):
                if not greedy:
                    q = float(probs[token])
                elif self.confidence.top_k is None and self.confidence.top_p is None:
                    q = float(torch.exp(top - torch.logsumexp(logits, dim=-1)))     # softmax of the arg-max
                else:
                    q = token_probability(logits, token, self.confidence)
                conf.append(q)
                if self.budget is not None:
                    c = float(self.budget.calibration(q))
                    values.append((values[-1] if values else 1.0) * c)
            if len(tokens) >= limit or not (probe or self._continue(values, conf, t0)):
                break
            logits = self.cache.read([len(tokens) - 1], [token], [len(tokens) - 2])[0]
        if self.budget is not None:     # send the prefix with the best expected tokens per second
            keep = len(tokens) if probe else self.budget.best_prefix(values, time.perf_counter() - t0, pending=1)
            tokens, laws, conf = tokens[:keep], laws[:keep], conf[:keep]
            if keep == 0:
                return DraftTree.empty()
        return DraftTree.chain(tokens, torch.stack(laws) if laws else None, draft_calls=self.cache.calls,
                               confidences=conf or None)

    def _context_round(self, committed, limit: int) -> DraftTree | None:
        """This round's context proposal (a deterministic chain: no draft read now; the draft model reads
        what is accepted at its next round, priced in) when its predicted tokens per second beat the draft
        model's chain — whose values the budget predicts from its running first-node value and
        continuation — else None."""
        costs = self.budget.costs
        catch_up = max(float(costs.draft(2)) - float(costs.draft(1)), 0.0)
        tokens, match, rates, rate = self.context.plan(committed, limit, costs.target, fixed_seconds=catch_up)
        if not tokens or rate <= self.budget.predicted_chain_rate(limit):
            return None
        return DraftTree.chain(list(tokens), confidences=rates, from_context=torch.ones(len(tokens), dtype=torch.bool),
                               context_match=match)

    def _continue(self, values, conf, t0) -> bool:
        if self.budget is None:
            return True
        b = self.budget
        r = float(b.calibration(conf[-1]))                    # confidence persists along a run of text
        gains = [values[-1] * r ** (j + 1) for j in range(b.lookahead)]
        return b.worth_extending(sum(values), len(values), time.perf_counter() - t0, 1, gains,
                                 [b.costs.draft(1)] * b.lookahead)

    def observe(self, feedback: RoundFeedback) -> None:
        tree = feedback.tree
        if tree.from_context is not None:       # a context round: the draft model read nothing
            self.budget.costs.observe_target(feedback.target_tokens, feedback.target_seconds)
            self.context.learn(tree, feedback)
            return
        if self.shared is not None and not len(tree) and self.shared.gamma_for_round(self.rounds) == 0:
            return          # a plain round of the batch: nothing drafted, nothing to learn (and no work under
                            # the interpreter every request shares)
        if len(tree):
            self.cache.keep(feedback.verdict.path)
        if self.shared is not None and (len(tree) or self.budget is not None):   # a request may draft nothing
            conf = tree.confidences.numpy() if tree.confidences is not None and not tree.sampled else None
            self.shared.observe(len(tree), feedback.verdict.accepted, self.rounds, conf)
        if self.budget is None:
            return
        costs = self.budget.costs
        costs.observe_target(feedback.target_tokens, feedback.target_seconds)
        if len(tree):
            for k, seconds in self.cache.reads:
                costs.observe_draft(k, seconds)
            t = feedback.node_target_probs.numpy()
            block = feedback.verdict.block_accept_probs
            if tree.sampled and block is not None and len(block) == len(tree):
                accept = np.asarray(block, dtype=np.float64)          # block verification: P(τ ≥ i | τ ≥ i − 1)
            elif tree.sampled:                                        # token-wise: exact acceptance of a sampled token
                q = tree.draft_probs[tree.parents + 1, tree.tokens].double().numpy()
                accept = np.minimum(1.0, t / np.maximum(q, 1e-300))
            else:                                                     # arg-max chain: the target's probability
                accept = t
            conf = tree.confidences.numpy()
            c = self.budget.calibration(conf)
            self.budget.learn(conf, accept, first_values=c[:1], best_children=c[1:])

    def describe(self) -> str:
        g = "auto" if self.budget is not None or self.gamma == "auto" or self.shared is not None else \
            ("horizon" if self.gamma is None else self.gamma)
        return f"chain(γ={g}{', context' if self.context is not None else ''})"
