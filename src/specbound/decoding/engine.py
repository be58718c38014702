"""The decoding loops: draft → one target pass → verify → commit / roll back the caches.

Cache discipline (as in gpt-fast): each model has read a prefix of the committed tokens. A round
first feeds the committed tokens a model has not read yet, then the drafted ones; after
verification each cache is cropped back to the committed tokens it holds, so a rejected token
never stays in a cache. The recovered or bonus token is read at the start of the next round.
"""
from __future__ import annotations

import time

import torch

from ..errors import SpecboundError
from ..models.base import LanguageModel, as_token_batch
from .result import DecodeMetrics, DecodeResult
from .sampling import SamplingConfig, logits_to_probs, sample_from
from .policy import AdaptiveGamma
from .verify import STANDARD, AcceptanceRule, verify_chain

__all__ = ["autoregressive_decode", "speculative_decode", "ChainSpeculator", "make_generator"]


def make_generator(seed) -> torch.Generator:
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen


def _check_budget(max_new_tokens) -> int:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise SpecboundError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    return max_new_tokens


def _feed(model: LanguageModel, committed: list[int], extra: list[int] = ()) -> torch.Tensor:
    """Read the committed tokens ``model`` has not read yet, then ``extra``; return their logits."""
    todo = committed[model.cache_length:] + list(extra)
    if not todo:
        raise SpecboundError(f"internal: nothing to feed {model.name}")
    return model.forward(torch.tensor([todo], dtype=torch.long))


def _prefill(model: LanguageModel, prompt: list[int]) -> None:
    """Read all prompt tokens but the last (its logits are computed in the first round)."""
    model.reset()
    if len(prompt) > 1:
        model.forward(torch.tensor([prompt[:-1]], dtype=torch.long))


def autoregressive_decode(target: LanguageModel, prompt, max_new_tokens: int, temperature: float = 1.0,
                          top_k: int | None = None, top_p: float | None = None, seed=None) -> DecodeResult:
    """Plain decoding from the target, one target call per token (Yin et al. 2024, Alg. 3)."""
    config = SamplingConfig(temperature, top_k, top_p)
    max_new_tokens = _check_budget(max_new_tokens)
    prompt_ids = as_token_batch(prompt, target.vocab_size)
    if prompt_ids.shape[0] != 1:
        raise SpecboundError("autoregressive_decode decodes one prompt at a time (batch 1)")
    committed = prompt_ids[0].tolist()
    gen = make_generator(seed)
    metrics = DecodeMetrics()
    start = time.perf_counter()
    _prefill(target, committed)
    metrics.prefill_time = time.perf_counter() - start
    for _ in range(max_new_tokens):
        t0 = time.perf_counter()
        logits = _feed(target, committed)[:, -1]
        metrics.target_time += time.perf_counter() - t0
        metrics.target_calls += 1
        committed.append(int(sample_from(logits_to_probs(logits, config, target.name), gen)[0]))
    metrics.new_tokens = max_new_tokens
    metrics.total_time = time.perf_counter() - start
    return DecodeResult(committed[prompt_ids.shape[1]:], prompt_ids[0].tolist(), metrics,
                        method="autoregressive", sampling=config.describe())


class ChainSpeculator:
    """Chain speculative decoding with draft length γ (or drafting to the horizon, Yin et al. Alg. 1).

    Small overridable steps: :meth:`draft` proposes, :meth:`score` runs the target once,
    :meth:`verify` calls the shared verification core.
    """

    def __init__(self, target: LanguageModel, draft: LanguageModel, config: SamplingConfig,
                 gamma: int | None, generator: torch.Generator, rule: AcceptanceRule = STANDARD):
        if target.vocab_size != draft.vocab_size:
            raise SpecboundError(
                f"vocabulary mismatch: target {target.name!r} has {target.vocab_size} tokens, "
                f"draft {draft.name!r} has {draft.vocab_size}; speculative decoding needs one vocabulary"
            )
        if not (gamma is None or gamma == "auto" or isinstance(gamma, AdaptiveGamma)
                or (isinstance(gamma, int) and not isinstance(gamma, bool) and gamma >= 1)):
            raise SpecboundError(f"gamma (draft length) must be an integer >= 1, None or 'auto', got {gamma!r}")
        self.target, self.draft_model, self.config = target, draft, config
        self.gamma, self.generator, self.rule = gamma, generator, rule

    # ---------------------------------------------------------------- steps
    def draft(self, committed: list[int], k: int) -> tuple[list[int], torch.Tensor]:
        """Sample k tokens from the draft; return them and the processed laws they came from [1, k, V]."""
        tokens, laws = [], []
        logits = _feed(self.draft_model, committed)[:, -1]
        t0 = time.perf_counter()
        for i in range(k):
            probs = logits_to_probs(logits, self.config, self.draft_model.name)
            token = int(sample_from(probs, self.generator)[0])
            tokens.append(token)
            laws.append(probs)
            if i < k - 1:
                logits = self.draft_model.forward(torch.tensor([[token]]))[:, -1]
        # cost of one drafted token, excluding the catch-up read of committed tokens (for the γ policy)
        self.seconds_per_draft_token = (time.perf_counter() - t0) / (k - 1) if k > 1 else None
        return tokens, torch.stack(laws, dim=1)

    def score(self, committed: list[int], drafted: list[int], with_bonus: bool) -> torch.Tensor:
        """One target pass; processed target laws before each drafted token (+ after the last)."""
        fed = drafted if with_bonus else drafted[:-1]
        logits = _feed(self.target, committed, fed)[:, -(len(fed) + 1):]
        return logits_to_probs(logits, self.config, self.target.name)

    def verify(self, drafted, draft_probs, target_probs):
        tokens = torch.tensor([drafted], dtype=torch.long)
        return verify_chain(tokens, draft_probs.to(target_probs.dtype), target_probs, self.generator, self.rule)

    def _plain_step(self, committed: list[int], metrics: DecodeMetrics) -> None:
        """One target call, one token: used when the cost model says speculation loses (γ = 0)."""
        t0 = time.perf_counter()
        logits = _feed(self.target, committed)[:, -1]
        probs = logits_to_probs(logits, self.config, self.target.name)
        committed.append(int(sample_from(probs, self.generator)[0]))
        metrics.target_time += time.perf_counter() - t0
        metrics.target_calls += 1
        metrics.record_round(0, 0, False)

    # ---------------------------------------------------------------- loop
    def run(self, prompt: list[int], max_new_tokens: int, callback=None, stop_token_ids=()) -> DecodeResult:
        """Decode; ``callback(new_token_ids)`` is called with each round's committed tokens (streaming).

        Decoding ends after ``max_new_tokens`` or right after the first token in ``stop_token_ids``.
        """
        stops = set(int(t) for t in (stop_token_ids or ()))
        metrics = DecodeMetrics()
        committed = list(prompt)
        start = time.perf_counter()
        _prefill(self.target, committed)
        _prefill(self.draft_model, committed)
        policy = self.gamma
        if policy == "auto":
            policy = AdaptiveGamma.calibrate(self.target, self.draft_model)
        self.policy = policy if isinstance(policy, AdaptiveGamma) else None
        metrics.prefill_time = time.perf_counter() - start
        end = len(prompt) + max_new_tokens
        while len(committed) < end:
            remaining = end - len(committed)
            if self.policy is not None:
                k = self.policy.choose(remaining)
            else:
                k = remaining if self.gamma is None else min(self.gamma, remaining)
            if k == 0:
                self._plain_step(committed, metrics)
                if callback is not None:
                    callback(committed[-1:])
                if committed[-1] in stops:
                    end = len(committed)
                continue
            with_bonus = k < remaining          # a bonus beyond the budget would be thrown away
            base = len(committed)

            t0 = time.perf_counter()
            drafted, draft_probs = self.draft(committed, k)
            t1 = time.perf_counter()
            target_probs = self.score(committed, drafted, with_bonus)
            t2 = time.perf_counter()
            verdict = self.verify(drafted, draft_probs, target_probs)
            t3 = time.perf_counter()

            n = int(verdict.accepted[0])
            committed.extend(drafted[:n])
            nxt = int(verdict.next_token[0])
            if nxt >= 0:
                committed.append(nxt)
            self.target.crop(min(base + n, self.target.cache_length))
            self.draft_model.crop(base + min(n, k - 1))

            metrics.draft_calls += k
            metrics.target_calls += 1
            metrics.draft_time += t1 - t0
            metrics.target_time += t2 - t1
            metrics.verify_time += t3 - t2
            metrics.record_round(k, n, bool(verdict.rejected[0]))
            if self.policy is not None:
                self.policy.observe(k, n, getattr(self, "seconds_per_draft_token", None), t2 - t1)
            stopped = next((i for i in range(base, min(len(committed), end)) if committed[i] in stops), None)
            if stopped is not None:
                end = stopped + 1
            if callback is not None:
                callback(committed[base:end])
        metrics.new_tokens = end - len(prompt)
        metrics.total_time = time.perf_counter() - start
        return DecodeResult(committed[len(prompt):end], list(prompt), metrics, method="speculative",
                            lossless=self.rule.lossless, sampling=self.config.describe())


def speculative_decode(target: LanguageModel, draft: LanguageModel, prompt, max_new_tokens: int,
                       gamma: int | None = None, temperature: float = 1.0, top_k: int | None = None,
                       top_p: float | None = None, seed=None, tree: int | None = None,
                       tree_drafter: str = "dynamic", callback=None,
                       drafts: int | None = None, design: str = "B", relaxation=None,
                       stop_token_ids=()) -> DecodeResult:
    """Lossless speculative decoding of ``target`` with ``draft`` (Leviathan et al.; Yin et al. 2024 Alg. 1).

    ``gamma`` is the draft length per round; ``gamma=None`` drafts to the horizon (Yin's setting, in
    which every round ends at a rejection); ``gamma="auto"`` measures the target's t(k) and the
    draft's cost and picks γ each round from the cost model (:mod:`specbound.theory.speedup`),
    falling back to plain target steps when speculation is predicted to lose. ``callback`` receives
    each round's new token ids (for streaming). Sampling settings apply identically to both models and
    the output law equals the target's processed law (Yin et al. 2024, Thm 1).

    ``drafts=M`` (≥ 1) verifies M i.i.d. draft sequences per round, all scored in one target pass (batch
    SD, Yin et al. 2024 Alg. 4 / Thm 3); ``design`` is "B" (recursive rejection at the round start, then
    one sequence; default) or "A" (prefix-tree DFS), see :mod:`specbound.decoding.batch`. ``drafts=1``
    is the chain engine. ``relaxation=("opt"|"uno", eps[, "additive"|"ratio"])`` switches to biased
    over-acceptance decoding (Decoding-OPT / -UNO, Yin et al. 2024 §5, one draft per step): the
    result has ``lossless=False`` and ``metrics.expected_bias`` holds the summed per-step TV bias.

    ``stop_token_ids`` (chain engine) ends decoding right after the first such token (e.g. EOS).

    ``tree=P`` drafts a tree of at most P nodes per round instead of a chain and verifies it in one
    target ``forward_tree`` pass (Pankratov & Alistarh 2026); ``tree_drafter`` is ``"dynamic"``,
    ``"sampled"``, ``"chain"`` or ``"oracle"`` (see :func:`specbound.decoding.tree.tree_speculative_decode`).
    """
    from .batch import BatchSpeculator, RelaxedChainSpeculator, check_design, check_drafts, parse_relaxation
    if tree is not None and (check_drafts(drafts) > 1 or relaxation is not None):
        raise SpecboundError("tree=P cannot be combined with drafts > 1 or relaxation")
    if tree is not None:
        if gamma is not None:
            raise SpecboundError("give either gamma (draft chain length) or tree (draft-tree capacity P), not both")
        from .tree import tree_speculative_decode
        return tree_speculative_decode(target, draft, prompt, max_new_tokens, tree, tree_drafter,
                                       temperature, top_k, top_p, seed, callback=callback)
    if tree_drafter != "dynamic":
        raise SpecboundError(f"tree_drafter={tree_drafter!r} needs tree=P (the draft-tree capacity)")
    config = SamplingConfig(temperature, top_k, top_p)
    max_new_tokens = _check_budget(max_new_tokens)
    n_drafts, design, rule = check_drafts(drafts), check_design(design), parse_relaxation(relaxation)
    if rule is not None and n_drafts > 1:
        raise SpecboundError("relaxation (Decoding-OPT/-UNO) is a one-draft rejection step (Yin et al. 2024 §5): "
                             "use drafts=None or 1 with it")
    if n_drafts > 1:
        engine = BatchSpeculator(target, draft, config, gamma, make_generator(seed), n_drafts, design)
    elif rule is not None:
        engine = RelaxedChainSpeculator(target, draft, config, gamma, make_generator(seed), rule)
    else:
        engine = ChainSpeculator(target, draft, config, gamma, make_generator(seed))
    prompt_ids = as_token_batch(prompt, target.vocab_size)
    if prompt_ids.shape[0] != 1:
        raise SpecboundError("speculative_decode decodes one prompt at a time (batch 1)")
    if stop_token_ids:
        if n_drafts > 1:
            raise SpecboundError("stop_token_ids is supported by the chain engine only (drafts=None or 1)")
        return engine.run(prompt_ids[0].tolist(), max_new_tokens, callback=callback, stop_token_ids=stop_token_ids)
    return engine.run(prompt_ids[0].tolist(), max_new_tokens, callback=callback)
