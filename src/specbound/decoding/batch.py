"""Batch speculative decoding (Yin et al. 2024, Alg. 4 / Thm 3) and relaxed decoding (§5, Thm 4/5).

**Batch SD.** Each round drafts M = ``drafts`` i.i.d. draft sequences of length k (γ, or to the
horizon with ``gamma=None``) from the committed prefix and scores all of them with ONE target
``forward_tree`` call. Verification (the branching rule is an open point of the paper, yin2024.md §2):

* design ``"B"`` (default): recursive rejection sampling among the M first tokens at the round
  start (:func:`~specbound.decoding.verify.recursive_rejection_sampling`), then plain speculative
  verification (:func:`~specbound.decoding.verify.verify_chain`) along the accepted sequence. This
  is the reconstruction whose exact rejections are :func:`specbound.theory.batch_expected_rejections`
  with ``design="B"`` (Thm 3, Prop. 1).
* design ``"A"``: prefix-tree depth-first walk: at every position recursive rejection sampling over
  all candidates that agree with the accepted prefix (they are i.i.d. draft samples given it).

Both are lossless. A rejection is a position where every tested candidate was rejected; as in
Alg. 1 it ends the round (with ``gamma=None`` every round but the last ends at one, so target
calls = rejections (+1)).

Model calls. The M drafts form a tree whose root (the last committed token) has M children and
every other node one child. The draft makes one call per depth: the committed tokens it has not
read (one ``forward``, giving the root law), then for each depth d ≥ 2 one ``forward_tree`` over
the nodes of depths 1..d−1 (the protocol cannot extend a tree already in the cache, so each depth
re-reads the tree so far: k calls and O(M·k²) node reads per round). The target makes ONE
``forward_tree`` per round over the committed tokens it has not read yet (a chain at the top of the
tree) followed by the M·k drafted nodes (M·(k−1) when no bonus token can be used). Afterwards both
models ``keep_path`` the accepted path, so no rejected token stays cached.

**Relaxed decoding** (``relaxation=("opt"|"uno", ε[, form])`` in
:func:`~specbound.decoding.engine.speculative_decode`): the chain engine with an over-accepting
:class:`~specbound.decoding.verify.RelaxedAcceptance` rule (Decoding-OPT / Decoding-UNO), which is
biased on purpose (``DecodeResult.lossless`` is False). :class:`RelaxedChainSpeculator` reports the
bias in ``DecodeMetrics.expected_bias``: the sum, over every verified position, of the exact TV
distance between that step's output law and the target law given the same prefix
(:meth:`~specbound.decoding.verify.RelaxedAcceptance.step_bias`; Thm 4: Σ[b·draft − target]_+ for
OPT). Bonus tokens come from the target law and add nothing. Its expectation bounds the TV distance
between the generated sequence's law and the target's (hybrid argument) and equals it for a single
token.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import SpecboundError, positive_int
from ..models.base import LanguageModel
from .engine import ChainSpeculator, _feed, _prefill
from .result import DecodeMetrics, DecodeResult
from .sampling import SamplingConfig, logits_to_probs, sample_from
from .verify import (
    OVER_ACCEPTANCE_FORMS, RELAXATIONS, STANDARD, AcceptanceRule, CandidatesVerdict, RelaxedAcceptance,
    recursive_rejection_sampling, verify_chain,
)

__all__ = ["BatchSpeculator", "BatchVerdict", "RelaxedChainSpeculator", "BATCH_DESIGNS", "check_drafts",
           "check_design", "parse_relaxation"]

BATCH_DESIGNS = ("A", "B")


# ---------------------------------------------------------------------------------------------- input
def check_drafts(drafts) -> int:
    """M (number of i.i.d. draft sequences per round): an integer ≥ 1; None means 1 (chain SD)."""
    if drafts is None:
        return 1
    return positive_int(drafts, "drafts (number of draft sequences per round)")


def check_design(design) -> str:
    """Batch verification design: "A" (prefix-tree DFS) or "B" (branch at the round start)."""
    key = design.upper() if isinstance(design, str) else design
    if key not in BATCH_DESIGNS:
        raise SpecboundError(
            f"design must be 'A' (prefix-tree DFS) or 'B' (branch at the round start, default), got {design!r}"
        )
    return key


def parse_relaxation(relaxation) -> RelaxedAcceptance | None:
    """``None`` or ``(name, eps)`` / ``(name, eps, form)`` → a relaxed acceptance rule (Yin et al. 2024, §5).

    ``name`` is "opt" (Decoding-OPT) or "uno" (Decoding-UNO); ``eps`` ≥ 0 the over-acceptance
    threshold; ``form`` "additive" (default, b = min(1, (target+ε)/draft)) or "ratio"
    (b = min(1, target/draft + ε)). An :class:`RelaxedAcceptance` instance is accepted as is.
    """
    if relaxation is None or isinstance(relaxation, RelaxedAcceptance):
        return relaxation
    if isinstance(relaxation, str) or not isinstance(relaxation, (tuple, list)) or len(relaxation) not in (2, 3):
        raise SpecboundError(
            "relaxation must be None or a tuple (name, eps) or (name, eps, form) with name in "
            f"{sorted(RELAXATIONS)}, e.g. ('opt', 0.1); got {relaxation!r}"
        )
    name, eps, *rest = relaxation
    key = name.lower() if isinstance(name, str) else name
    if key not in RELAXATIONS:
        raise SpecboundError(f"unknown relaxation {name!r}: use one of {sorted(RELAXATIONS)} (Decoding-OPT / -UNO)")
    form = rest[0] if rest else "additive"
    if form not in OVER_ACCEPTANCE_FORMS:
        raise SpecboundError(f"relaxation form must be one of {OVER_ACCEPTANCE_FORMS}, got {form!r}")
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(eps)) or eps < 0:
        raise SpecboundError(f"relaxation eps (over-acceptance threshold) must be a finite number >= 0, got {eps!r}")
    return RELAXATIONS[key](float(eps), form)


def _read_root(model: LanguageModel, committed: list[int]) -> int:
    """Make sure ``model`` has at least one committed token to read (its logits give the root law);
    return the cache length the round's tree starts from."""
    if model.cache_length > len(committed):
        raise SpecboundError(f"internal: {model.name} has read more tokens than are committed")
    if model.cache_length == len(committed):
        model.crop(len(committed) - 1)
    return model.cache_length


# ---------------------------------------------------------------------------------------------- batch
@dataclass
class BatchVerdict:
    """Outcome of one round of batch verification."""

    chain: int          # draft sequence whose first ``accepted`` tokens are kept (its nodes form the path)
    accepted: int       # number of drafted tokens accepted
    next_token: int     # recovered or bonus token; −1 when none (no bonus law given)
    rejected: bool      # the round ended at a rejection (all candidates at a position rejected)


class BatchSpeculator:
    """Batch speculative decoding with M i.i.d. draft sequences per round (Yin et al. 2024, Alg. 4, Thm 3).

    Overridable steps as in :class:`~specbound.decoding.engine.ChainSpeculator`: :meth:`draft`,
    :meth:`score` (one target pass), :meth:`verify` (design A or B) and :meth:`select` (recursive
    rejection sampling among candidates at one position). Lossless for both designs.
    """

    def __init__(self, target: LanguageModel, draft: LanguageModel, config: SamplingConfig,
                 gamma: int | None, generator: torch.Generator, drafts: int, design: str = "B"):
        if target.vocab_size != draft.vocab_size:
            raise SpecboundError(
                f"vocabulary mismatch: target {target.name!r} has {target.vocab_size} tokens, "
                f"draft {draft.name!r} has {draft.vocab_size}; speculative decoding needs one vocabulary"
            )
        if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1):
            raise SpecboundError(f"gamma (draft length) must be an integer >= 1 or None for batch SD, got {gamma!r}")
        for model in (target, draft):
            if type(model).forward_tree is LanguageModel.forward_tree:
                raise SpecboundError(
                    f"{model.name} does not implement forward_tree/keep_path, which batch speculative "
                    "decoding needs (use drafts=None for chain speculative decoding)"
                )
        self.target, self.draft_model, self.config = target, draft, config
        self.gamma, self.generator = gamma, generator
        self.drafts, self.design = check_drafts(drafts), check_design(design)

    # ---------------------------------------------------------------- steps
    def draft(self, committed: list[int], k: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Sample M i.i.d. draft sequences of length k.

        Returns tokens [M, k], the processed draft laws they were sampled from [M, k, V], and the
        draft's cache length below the tree (the committed prefix). After the call the draft's cache
        holds that prefix plus, when k ≥ 2, the tree of depths 1..k−1 (node (depth j, sequence i) at
        index (j−1)·M + i), ready for :meth:`LanguageModel.keep_path`.
        """
        model, m = self.draft_model, self.drafts
        _read_root(model, committed)
        root = logits_to_probs(_feed(model, committed)[:, -1], self.config, model.name)    # [1, V]
        base = model.cache_length
        laws = [root.expand(m, -1)]
        tokens = torch.empty((m, k), dtype=torch.long)
        tokens[:, 0] = sample_from(laws[0], self.generator)
        parents = [-1] * m
        for d in range(1, k):
            if d > 1:
                model.crop(base)                       # re-read the tree so far (see module docstring)
                parents += [(d - 2) * m + i for i in range(m)]
            flat = tokens[:, :d].t().reshape(1, -1)
            logits = model.forward_tree(flat, parents)[0, -m:]
            laws.append(logits_to_probs(logits, self.config, model.name))
            tokens[:, d] = sample_from(laws[-1], self.generator)
        return tokens, torch.stack(laws, dim=1), base

    def score(self, committed: list[int], tokens: torch.Tensor, with_bonus: bool) -> tuple[torch.Tensor, int, int]:
        """ONE target ``forward_tree`` over the unread committed tokens and the drafted nodes.

        Returns the processed target laws [M, depth+1, V] (row j of sequence i: the law before its
        (j+1)-th drafted token, or after the last one, the bonus law; depth = k with a bonus, k−1
        without), the cache length below the tree, and the number of committed tokens read in the call.
        """
        model = self.target
        m, k = tokens.shape
        base = _read_root(model, committed)
        pending = committed[base:]
        p = len(pending)
        depth = k if with_bonus else k - 1
        nodes = list(pending) + tokens[:, :depth].t().reshape(-1).tolist()
        parents = list(range(-1, p - 1))
        if depth:
            parents += [p - 1] * m + [p + (j - 1) * m + i for j in range(1, depth) for i in range(m)]
        logits = model.forward_tree(torch.tensor([nodes], dtype=torch.long), parents)[0]
        probs = logits_to_probs(logits, self.config, model.name)
        root = probs[p - 1].expand(m, 1, -1)
        rest = probs[p:].reshape(depth, m, probs.shape[-1]).transpose(0, 1)
        return torch.cat([root, rest], dim=1), base, p

    def select(self, candidates: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
               alive: torch.Tensor | None = None) -> CandidatesVerdict:
        """Recursive rejection sampling among the candidates at one position (shared verification core)."""
        return recursive_rejection_sampling(candidates, draft_probs, target_probs, self.generator, alive)

    def verify(self, tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor) -> BatchVerdict:
        return self._verify_a(tokens, draft_probs, target_probs) if self.design == "A" \
            else self._verify_b(tokens, draft_probs, target_probs)

    def _draw(self, law: torch.Tensor) -> int:
        return int(torch.multinomial(law, 1, generator=self.generator))

    def _verify_b(self, tokens, draft_probs, target_probs) -> BatchVerdict:
        """Design B: recursive rejection at the round start, then Alg. 1 along the accepted sequence."""
        k = tokens.shape[1]
        with_bonus = target_probs.shape[1] > k
        first = self.select(tokens[:, 0].unsqueeze(0), draft_probs[0, :1], target_probs[0, :1])
        chain = int(first.accepted[0])
        if chain < 0:
            return BatchVerdict(0, 0, self._draw(first.residual[0]), True)
        if k == 1:
            return BatchVerdict(chain, 1, self._draw(target_probs[chain, 1]) if with_bonus else -1, False)
        rest = verify_chain(tokens[chain:chain + 1, 1:], draft_probs[chain:chain + 1, 1:],
                            target_probs[chain:chain + 1, 1:], self.generator)
        return BatchVerdict(chain, 1 + int(rest.accepted[0]), int(rest.next_token[0]), bool(rest.rejected[0]))

    def _verify_a(self, tokens, draft_probs, target_probs) -> BatchVerdict:
        """Design A: at every position, recursive rejection among the candidates sharing the accepted prefix."""
        m, k = tokens.shape
        alive = torch.ones(m, dtype=torch.bool)
        chain = 0
        for t in range(k):
            # all alive sequences share the prefix, so their laws at position t coincide
            verdict = self.select(tokens[:, t].unsqueeze(0), draft_probs[chain, t:t + 1],
                                  target_probs[chain, t:t + 1], alive.unsqueeze(0))
            accepted = int(verdict.accepted[0])
            if accepted < 0:
                return BatchVerdict(chain, t, self._draw(verdict.residual[0]), True)
            chain = accepted
            alive &= tokens[:, t] == tokens[chain, t]
        with_bonus = target_probs.shape[1] > k
        return BatchVerdict(chain, k, self._draw(target_probs[chain, k]) if with_bonus else -1, False)

    # ---------------------------------------------------------------- loop
    def run(self, prompt: list[int], max_new_tokens: int, callback=None) -> DecodeResult:
        """Decode; ``callback(new_token_ids)`` is called with each round's committed tokens (streaming)."""
        metrics = DecodeMetrics()
        committed = list(prompt)
        m = self.drafts
        start = time.perf_counter()
        _prefill(self.target, committed)
        _prefill(self.draft_model, committed)
        metrics.prefill_time = time.perf_counter() - start
        end = len(prompt) + max_new_tokens
        while len(committed) < end:
            remaining = end - len(committed)
            k = remaining if self.gamma is None else min(self.gamma, remaining)
            with_bonus = k < remaining          # a bonus beyond the budget would be thrown away

            t0 = time.perf_counter()
            tokens, draft_probs, draft_base = self.draft(committed, k)
            t1 = time.perf_counter()
            target_probs, target_base, pending = self.score(committed, tokens, with_bonus)
            t2 = time.perf_counter()
            verdict = self.verify(tokens, draft_probs.to(target_probs.dtype), target_probs)
            t3 = time.perf_counter()

            n, chain = verdict.accepted, verdict.chain
            base = len(committed)
            committed.extend(tokens[chain, :n].tolist())
            if verdict.next_token >= 0:
                committed.append(verdict.next_token)
            depth = target_probs.shape[1] - 1
            self.target.keep_path(target_base, list(range(pending))
                                  + [pending + j * m + chain for j in range(min(n, depth))])
            if k >= 2:
                self.draft_model.keep_path(draft_base, [j * m + chain for j in range(min(n, k - 1))])

            metrics.draft_calls += k
            metrics.target_calls += 1
            metrics.draft_time += t1 - t0
            metrics.target_time += t2 - t1
            metrics.verify_time += t3 - t2
            metrics.record_round(k, n, verdict.rejected)
            if callback is not None:
                callback(committed[base:end])
        metrics.new_tokens = max_new_tokens
        metrics.total_time = time.perf_counter() - start
        return DecodeResult(committed[len(prompt):end], list(prompt), metrics,
                            method=f"batch-speculative(M={m}, design {self.design})",
                            lossless=True, sampling=self.config.describe())


# ---------------------------------------------------------------------------------------------- relaxed
class RelaxedChainSpeculator(ChainSpeculator):
    """Chain speculative decoding with a relaxed (biased) rule: Decoding-OPT / -UNO (Yin et al. 2024, §5).

    Same loop as :class:`ChainSpeculator`; :meth:`verify` also adds the exact one-step TV bias of
    every verified position (:meth:`RelaxedAcceptance.step_bias`, Thm 4) to
    ``DecodeMetrics.expected_bias`` and counts the positions in ``DecodeMetrics.bias_positions``.
    """

    def __init__(self, target: LanguageModel, draft: LanguageModel, config: SamplingConfig,
                 gamma: int | None, generator: torch.Generator, rule: AcceptanceRule = STANDARD):
        super().__init__(target, draft, config, gamma, generator, rule)
        self._bias, self._bias_positions = 0.0, 0

    def verify(self, drafted, draft_probs, target_probs):
        verdict = super().verify(drafted, draft_probs, target_probs)
        if isinstance(self.rule, RelaxedAcceptance):
            verified = min(int(verdict.accepted[0]) + 1, len(drafted))   # accepted + the rejected one
            bias = self.rule.step_bias(target_probs[0, :verified], draft_probs[0, :verified].to(target_probs.dtype))
            self._bias += float(bias.sum())
            self._bias_positions += verified
        return verdict

    def run(self, prompt: list[int], max_new_tokens: int, callback=None, stop_token_ids=()) -> DecodeResult:
        self._bias, self._bias_positions = 0.0, 0
        result = super().run(prompt, max_new_tokens, callback=callback, stop_token_ids=stop_token_ids)
        result.metrics.expected_bias = self._bias
        result.metrics.bias_positions = self._bias_positions
        describe = getattr(self.rule, "describe", None)
        result.method = f"speculative-{describe()}" if describe else result.method
        return result
