"""THE decoding loop: draft a tree → ONE target pass → verify → commit, keep the accepted path.

:class:`Speculator` is written once for every drafter (chain, batch, trees, oracle, none). Cache
discipline (as in gpt-fast): each model's committed chain is a prefix of the committed tokens. A
round reads the committed tokens the target has not read yet (usually the last round's recovered or
bonus token) as the first nodes of the SAME target pass as the draft tree, so a round is exactly one
target call; afterwards ``keep_path`` leaves only the committed tokens and the accepted path in the
cache, so a rejected token never survives. Tree nodes at the depth where the budget ends are
verified but not read (no law after them is needed).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..errors import SpecboundError
from ..models.base import LanguageModel, as_token_batch
from .acceptance import acceptance_key, remember_acceptance
from .drafters import (
    BatchDrafter, ChainDrafter, Drafter, RoundFeedback, check_batch_gamma, check_design, check_drafts, check_gamma,
    check_tree_drafter, make_tree_drafter,
)
from .drafters.context import ContextDrafter
from .drafters.shapes import ShapeDrafter, check_shape
from .result import DecodeMetrics, DecodeResult, RoundRecord
from .sampling import SamplingConfig, logits_to_probs
from .tree import DraftTree
from .verify import (
    BLOCK, STANDARD, AcceptanceRule, BlockVerification, Verdict, parse_relaxation, parse_verification,
    resolve_verification, verify,
)

__all__ = ["DecodeInterrupted", "DraftSpec", "PlainDrafter", "Speculator", "TargetPass", "autoregressive_decode",
           "make_generator", "speculative_decode"]


class DecodeInterrupted(KeyboardInterrupt):
    """Ctrl-C during decoding; ``result`` holds the tokens committed so far and their metrics."""

    def __init__(self, result: DecodeResult):
        super().__init__("decoding interrupted")
        self.result = result


def make_generator(seed) -> torch.Generator:
    gen = torch.Generator()
    if seed is None:
        gen.seed()
        return gen
    try:
        gen.manual_seed(int(seed))
    except (TypeError, ValueError, RuntimeError):
        raise SpecboundError(f"seed must be an integer or None, got {seed!r}") from None
    return gen


def check_budget(max_new_tokens) -> int:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise SpecboundError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    return max_new_tokens


def check_vocabularies(target: LanguageModel, draft: LanguageModel | None) -> None:
    """Target and draft must share one vocabulary (the same number of logits)."""
    if draft is not None and draft is not target and draft.vocab_size != target.vocab_size:
        raise SpecboundError(
            f"vocabulary mismatch: target {target.name!r} has {target.vocab_size} tokens, "
            f"draft {draft.name!r} has {draft.vocab_size}; speculative decoding needs one vocabulary"
        )


def check_context(target: LanguageModel, prompt_length: int, max_new_tokens: int, name: str = "prompt") -> None:
    """The prompt and the new tokens must fit the target's context (the last new token is never read)."""
    limit = target.info.max_positions
    if limit is not None and prompt_length + max_new_tokens - 1 > limit:
        raise SpecboundError(
            f"{name} ({prompt_length} tokens) + max_new_tokens ({max_new_tokens}) exceeds the target's context "
            f"of {limit} positions; shorten the prompt or lower max_new_tokens"
        )


@dataclass
class TargetPass:
    """What the round's ONE target pass gives verification and the cache (n = tree nodes, V = vocab)."""

    target_probs: torch.Tensor            # [n+1, V] processed target law at the root (row 0) and after node i (row i+1)
    law_mask: torch.Tensor | None         # [n+1] bool: rows that hold a law (None: all; nodes at the budget's depth are not read)
    base: int                             # the target's committed length before the pass
    slots: list[int]                      # [n] cache slot of node i, −1 when not read
    tokens_read: int                      # tokens in the pass: unread committed tokens + read nodes

    @property
    def pending(self) -> int:
        """Committed tokens the target read first (usually the last round's recovered/bonus token)."""
        return self.tokens_read - sum(s >= 0 for s in self.slots)


class PlainDrafter(Drafter):
    """No draft: every round is one target step (autoregressive decoding, Yin et al. 2024, Alg. 3)."""

    name = "plain"

    def propose(self, committed, max_depth, generator):
        return DraftTree.empty()


class Speculator:
    """Speculative decoding of ``target`` with any :class:`~specbound.decoding.drafters.Drafter`.

    ``rule`` is the acceptance rule (standard SD, a relaxed Decoding-OPT/-UNO rule for sampled
    chains, or :data:`~specbound.decoding.verify.BLOCK`: block verification of sampled chains); ``stop_tokens`` end decoding right after the first such token. :meth:`run` returns a
    :class:`DecodeResult` with the tokens and metrics (τ, per-depth acceptance, times, bias).
    """

    def __init__(self, target: LanguageModel, drafter: Drafter, sampling: SamplingConfig | None = None,
                 rule: AcceptanceRule | BlockVerification = STANDARD, stop_tokens=(),
                 generator: torch.Generator | None = None, stop=None):
        if not isinstance(target, LanguageModel):
            raise SpecboundError(f"target must be a LanguageModel, got {type(target).__name__}")
        if not isinstance(drafter, Drafter):
            raise SpecboundError(f"drafter must be a Drafter, got {type(drafter).__name__}")
        check_vocabularies(target, drafter.model)
        if drafter.needs_tree_target and not target.supports_trees:
            raise SpecboundError(f"{target.name} does not implement forward_tree/keep_path, which the "
                                 f"{drafter.describe()} drafter needs (chain drafting works without it)")
        self.target, self.drafter = target, drafter
        self.sampling = sampling or drafter.sampling
        self.rule = rule
        self.stop_tokens = {int(t) for t in (stop_tokens or ())}
        self.generator = generator if generator is not None else make_generator(None)
        self.stop = stop               # a threading.Event: set = stop as at Ctrl-C (batched decoding)

    # ---------------------------------------------------------------- one target pass
    def score(self, committed: list[int], tree: DraftTree, remaining: int) -> TargetPass:
        """ONE target pass over the unread committed tokens and the tree nodes of depth < ``remaining``."""
        target = self.target
        base = target.committed_length
        target.crop(base)
        if base > len(committed):
            raise SpecboundError(f"internal: {target.name} has read more tokens than are committed")
        if base == len(committed):        # everything read: re-read the last token for the root law
            base -= 1
            target.crop(base)
        pending = committed[base:]
        p = len(pending)
        read = (tree.depths < remaining).tolist()
        nodes = [i for i, r in enumerate(read) if r]
        slot = [-1] * len(tree)
        for j, i in enumerate(nodes):
            slot[i] = base + p + j
        tokens = torch.tensor([pending + tree.tokens[nodes].tolist()], dtype=torch.long)
        if tree.is_chain():
            logits = target.forward(tokens)[0, p - 1:]
        else:
            parents = list(range(base - 1, base + p - 1))
            parents += [base + p - 1 if tree.parents[i] < 0 else slot[int(tree.parents[i])] for i in nodes]
            logits = target.forward_tree(tokens, parents)[0, p - 1:]
        probs = logits_to_probs(logits, self.sampling, target.name)
        if len(nodes) == len(tree):
            return TargetPass(probs, None, base, slot, tokens.shape[1])
        target_probs = probs.new_zeros(len(tree) + 1, probs.shape[-1])
        law_mask = torch.zeros(len(tree) + 1, dtype=torch.bool)
        rows = torch.tensor([0] + [i + 1 for i in nodes], dtype=torch.long)
        target_probs[rows], law_mask[rows] = probs, True
        return TargetPass(target_probs, law_mask, base, slot, tokens.shape[1])

    # ---------------------------------------------------------------- the loop
    def run(self, prompt, max_new_tokens: int, callback=None) -> DecodeResult:
        """Decode; ``callback(new_token_ids)`` is called with each round's committed tokens (streaming).

        Ends after ``max_new_tokens`` or right after the first stop token. Ctrl-C raises
        :class:`DecodeInterrupted` carrying the result so far.
        """
        max_new_tokens = check_budget(max_new_tokens)
        prompt_ids = as_token_batch(prompt, self.target.vocab_size)
        if prompt_ids.shape[0] != 1:
            raise SpecboundError("a Speculator decodes one prompt; give several to speculative_decode_batch")
        prompt = prompt_ids[0].tolist()
        check_context(self.target, len(prompt), max_new_tokens)
        metrics = DecodeMetrics()
        rounds: list[RoundRecord] = []
        committed = list(prompt)
        end = len(prompt) + max_new_tokens
        start = time.perf_counter()

        def result() -> DecodeResult:
            metrics.new_tokens = min(len(committed), end) - len(prompt)
            metrics.total_time = time.perf_counter() - start
            same = self.rule is STANDARD or (self.rule is BLOCK and self.sampling.greedy)   # greedy: one rule
            method = self.drafter.describe() + ("" if same else f" + {self.rule.describe()}")
            if not same and self.rule is BLOCK and self.drafter.mixed_shapes:
                method += " of its chain rounds"
            return DecodeResult(committed[len(prompt):end], list(prompt), metrics, method=method,
                                lossless=self.rule.lossless, sampling=self.sampling.describe(), rounds=rounds)

        try:
            if max_new_tokens:
                self.target.prefill(prompt[:-1])
                self.drafter.start(self.target, prompt)
            metrics.calibration_time = self.drafter.calibration_time
            start += metrics.calibration_time           # one-time set-up: reported apart, not in total_time
            metrics.prefill_time = time.perf_counter() - start
            while len(committed) < end:
                if self.stop is not None and self.stop.is_set():
                    raise KeyboardInterrupt
                before = len(committed)
                verdict = self._round(committed, end - before, metrics, rounds)
                if self.stop_tokens:
                    hit = next((i for i in range(before, min(len(committed), end)) if committed[i] in self.stop_tokens),
                               None)
                    if hit is not None:
                        end = hit + 1
                if callback is not None:
                    callback(committed[before:end])
                if verdict.next_token < 0:
                    break
        except KeyboardInterrupt:
            metrics.interrupted = True
            raise DecodeInterrupted(result()) from None
        finally:
            self.drafter.finish()
        return result()

    def _round(self, committed: list[int], remaining: int, metrics: DecodeMetrics, rounds: list) -> Verdict:
        t0 = time.perf_counter()
        tree = self.drafter.propose(committed, remaining, self.generator)
        t1 = time.perf_counter()
        scored = self.score(committed, tree, remaining)
        t2 = time.perf_counter()
        rule = self.rule
        if rule is BLOCK and self.drafter.mixed_shapes and not tree.is_chain():
            rule = STANDARD                   # a tree round of shape="auto": recursive rejection over siblings
        verdict = verify(tree, scored.target_probs, scored.law_mask, rule, self.generator)
        t3 = time.perf_counter()
        kept = list(range(scored.base, scored.base + scored.pending))
        for node in verdict.path:
            if scored.slots[node] < 0:
                break
            kept.append(scored.slots[node])
        self.target.keep_path(scored.base, kept)
        rounds.append(RoundRecord(len(committed), len(tree), tree.depth, verdict.accepted, verdict.ended, tree.value,
                                  verdict.accept_probs))
        committed.extend(tree.tokens[verdict.path].tolist())
        if verdict.next_token >= 0:
            committed.append(verdict.next_token)
        node_target_probs = None
        if len(tree):
            rows = tree.parents + 1
            node_target_probs = scored.target_probs[rows, tree.tokens].double()
            if scored.law_mask is not None:
                node_target_probs[~scored.law_mask[rows]] = float("nan")
        laws = scored.target_probs if scored.law_mask is None and len(tree) else None
        self.drafter.observe(RoundFeedback(tree, verdict, t1 - t0, t2 - t1, scored.tokens_read, node_target_probs,
                                           t3 - t2, laws))
        metrics.draft_calls += tree.draft_calls
        metrics.target_calls += 1
        metrics.draft_time += t1 - t0
        metrics.target_time += t2 - t1
        metrics.verify_time += t3 - t2
        if tree.from_context is not None and len(tree):
            metrics.context_drafted += int(tree.from_context.sum())
            metrics.context_accepted += min(verdict.accepted, int(tree.from_context.sum()))
        metrics.record_round(len(tree), tree.depth, verdict.accepted, len(verdict.accept_probs), verdict.rejected,
                             None if self.rule.lossless else verdict.bias)
        return verdict


# ---------------------------------------------------------------------------------------------------
# the friendly entries
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftSpec:
    """What to draft, validated without any model (so a CLI can refuse bad options before loading).

    ``gamma`` (int ≥ 1, None = to the horizon, "auto"), ``tree`` (capacity P) with ``tree_drafter``,
    ``drafts`` (M) with ``design``, ``relaxation`` (Decoding-OPT/-UNO on a chain), ``verification``
    ("token", "block" for a chain, or "auto": block where it applies, resolved here); see :func:`speculative_decode` for their meaning. :meth:`build`
    makes the drafter.
    """

    gamma: object = None
    tree: object = None            # capacity P, "auto" or None
    tree_drafter: str = "dynamic"
    drafts: int | None = None
    design: str = "B"
    relaxation: object = None
    verification: str = "token"
    shape: str | None = None       # "auto": the drafted shape chosen every round (ShapeDrafter)
    context: str = "off"           # "auto": a γ = auto chain's rounds may draft from the context instead

    def __post_init__(self):
        if self.context not in ("auto", "off"):
            raise SpecboundError(f"context must be 'auto' or 'off', got {self.context!r}")
        if self.context == "auto" and (self.gamma != "auto" or self.tree is not None or (self.drafts or 1) > 1
                                       or self.shape == "auto"):
            raise SpecboundError("context='auto' needs gamma='auto' (one chain sized every round), "
                                 "no tree, drafts or shape='auto'")
        n_drafts = check_drafts(self.drafts)
        object.__setattr__(self, "design", check_design(self.design))
        object.__setattr__(self, "shape", check_shape(self.shape))
        if self.shape == "auto" and (self.tree is not None or n_drafts > 1 or self.gamma not in (None, "auto")
                                     or self.relaxation is not None):
            raise SpecboundError("shape='auto' chooses the drafted shape itself (a chain of γ = auto, 2 drafts or a "
                                 "sampled tree each round): give it without gamma=N, tree, drafts or relaxation")
        rule = parse_relaxation(self.relaxation)
        object.__setattr__(self, "verification", resolve_verification(
            self.verification, chain=self.tree is None and n_drafts == 1, relaxed=rule is not STANDARD))
        if parse_verification(self.verification) is BLOCK:
            if rule is not STANDARD:
                raise SpecboundError("block verification is lossless; it cannot be combined with a relaxation "
                                     "(Decoding-OPT/-UNO)")
            if self.tree is not None or n_drafts > 1:
                raise SpecboundError("block verification (Sun et al. 2025) verifies one drafted chain: use it with "
                                     "gamma (no tree=P, drafts=None or 1)")
        if rule is not STANDARD and (self.tree is not None or n_drafts > 1):
            raise SpecboundError("relaxation (Decoding-OPT/-UNO) is a one-draft rejection step (Yin et al. 2024 §5): "
                                 "use it with a drafted chain (no tree=P, drafts=None or 1)")
        if self.tree is not None:
            check_tree_drafter(self.tree_drafter, self.tree)
            if n_drafts > 1:
                raise SpecboundError("tree=P cannot be combined with drafts > 1")
            if self.gamma is not None:
                raise SpecboundError("give either gamma (draft chain length) or tree (draft-tree capacity P), not both")
        else:
            if self.tree_drafter != "dynamic":
                raise SpecboundError(f"tree_drafter={self.tree_drafter!r} needs tree=P (the draft-tree capacity)")
            if n_drafts > 1:
                check_batch_gamma(self.gamma)
            else:
                check_gamma(self.gamma)

    @property
    def rule(self) -> AcceptanceRule | BlockVerification:
        if self.verification == "block":
            return BLOCK
        return parse_relaxation(self.relaxation)

    @property
    def drafts_a_chain(self) -> bool:
        """One drafted chain per round under a lossless rule: the runs whose per-depth acceptance a pair
        remembers (:mod:`specbound.decoding.acceptance`)."""
        return (self.tree is None and check_drafts(self.drafts) == 1 and self.shape != "auto"
                and self.relaxation is None)

    @property
    def needs_draft_model(self) -> bool:
        return not (self.tree is not None and self.tree_drafter == "oracle")

    def build(self, target: LanguageModel, draft: LanguageModel | None, sampling: SamplingConfig) -> Drafter:
        if self.tree is not None:
            return make_tree_drafter(self.tree_drafter, target, draft, sampling, self.tree)
        if draft is None:
            if self.shape == "auto" or check_drafts(self.drafts) > 1 or self.gamma not in (None, "auto"):
                raise SpecboundError("without a draft model the drafter is the context (tokens found earlier in "
                                     "the prompt and output), sized every round: give no gamma, drafts or shape")
            return ContextDrafter(sampling)
        if self.shape == "auto":
            return ShapeDrafter(draft, sampling)
        if check_drafts(self.drafts) > 1:
            return BatchDrafter(draft, sampling, self.drafts, self.gamma, self.design)
        return ChainDrafter(draft, sampling, self.gamma, context=self.context == "auto")


def speculative_decode(target: LanguageModel, draft: LanguageModel | None, prompt, max_new_tokens: int, *,
                       gamma=None, temperature: float = 1.0, top_k: int | None = None,
                       top_p: float | None = None, seed=None, tree: int | None = None,
                       tree_drafter: str = "dynamic", callback=None, drafts: int | None = None,
                       design: str = "B", relaxation=None, stop_token_ids=(),
                       verification: str = "token", shape: str | None = None, context: str = "off") -> DecodeResult:
    """Lossless speculative decoding of ``target`` with ``draft`` (Leviathan et al.; Yin et al. 2024 Alg. 1).

    One loop (:class:`Speculator`) for every drafter, chosen by the keywords: ``gamma`` (chain length per
    round; ``None`` drafts to the horizon, ``"auto"`` sizes it every round from the measured costs, γ = 0:
    a plain step); ``drafts=M`` (M i.i.d. drafts per round in one target pass, Yin et al. Alg. 4 / Thm 3,
    ``design`` "B" or "A"); ``tree=P`` (a draft tree of at most P nodes, ``tree_drafter`` "dynamic",
    "sampled", "chain" or "oracle"; ``"auto"``: the dynamic tree sized every round); ``shape="auto"`` (each
    round the shape predicted fastest); ``relaxation=("opt"|"uno", eps[, form])`` or ``"opt:0.1"``
    (Decoding-OPT/-UNO, Yin et al. §5: NOT lossless, ``metrics.expected_bias`` sums the exact TV bias);
    ``verification`` "token" (default: Yin's Alg. 1, whose rejection counts the analysis measures), "block"
    (Sun et al. 2025: the same law, never fewer accepted tokens) or "auto" (block wherever it applies).
    Sampling settings apply identically to target and draft; the output law is the target's processed
    law (Yin et al. 2024, Thm 1). ``callback`` receives each round's new token ids; ``stop_token_ids`` end
    decoding right after the first such token (e.g. EOS). Every keyword in full: docs/notes.md (`engine.py`).
    """
    sampling = SamplingConfig(temperature, top_k, top_p)
    max_new_tokens = check_budget(max_new_tokens)
    spec = DraftSpec(gamma, tree, tree_drafter, drafts, design, relaxation, verification, shape, context)
    engine = Speculator(target, spec.build(target, draft, sampling), sampling, spec.rule, stop_token_ids,
                        make_generator(seed))
    try:
        out = engine.run(prompt, max_new_tokens, callback=callback)
    except DecodeInterrupted as stop:
        stop.result.costs = engine.drafter.cost_model()
        raise
    out.costs = engine.drafter.cost_model()
    if spec.drafts_a_chain:
        remember_acceptance(acceptance_key(target, draft, sampling, spec.verification), [out.metrics])
    return out


def autoregressive_decode(target: LanguageModel, prompt, max_new_tokens: int, *, temperature: float = 1.0,
                          top_k: int | None = None, top_p: float | None = None, seed=None,
                          stop_token_ids=(), callback=None) -> DecodeResult:
    """Plain decoding from the target, one target call per token (Yin et al. 2024, Alg. 3): the same
    loop with no drafter."""
    sampling = SamplingConfig(temperature, top_k, top_p)
    engine = Speculator(target, PlainDrafter(sampling), sampling, STANDARD, stop_token_ids, make_generator(seed))
    out = engine.run(prompt, max_new_tokens, callback=callback)
    out.method = "autoregressive"
    return out
