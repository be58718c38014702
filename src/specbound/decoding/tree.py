"""Tree speculative decoding: draft a tree → ONE target ``forward_tree`` pass → verify → keep the path.

Pankratov & Alistarh 2026, §1 (model of speculative generation with a draft tree of capacity P):
one round drafts a prefix-closed tree of at most P nodes, the target scores all of them in one
parallel pass, lossless tree verification accepts a root-to-node path (X tokens) and adds one
recovered or bonus token, so a round emits X + 1 tokens per target call.

Cache discipline (as in :mod:`specbound.decoding.engine`): the committed tokens the target has not
read yet (the last round's recovered/bonus token, or the prompt's last token) are fed as the first
node(s) of the SAME ``forward_tree`` call, as a chain the draft tree hangs below, so a round is
exactly one target call. Afterwards ``keep_path`` leaves the committed prefix plus the accepted
nodes in the cache (a rejected node never stays). Nodes at the depth where the generation budget
ends are verified but not read (no law after them is needed), which also keeps finite-horizon
models inside their horizon.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..errors import SpecboundError
from ..models.base import LanguageModel, as_token_batch
from .drafters import DETERMINISTIC, DraftedTree, TreeDrafter, TreeReader, make_tree_drafter
from .result import DecodeMetrics, DecodeResult
from .sampling import SamplingConfig, logits_to_probs
from .verify import TreeVerdict, verify_tree_deterministic, verify_tree_multidraft

__all__ = ["TreeRound", "TreeSpeculator", "tree_speculative_decode"]


@dataclass
class TreeRound:
    """Per-round record: committed length before the round, tree size and depth, X, how it ended,
    and E[X | T] when the drafter knows it (oracle)."""

    committed: int
    size: int
    depth: int
    accepted: int
    ended: str            # "recovered", "bonus" or "budget" (no token after the accepted path)
    value: float


class TreeSpeculator:
    """Tree speculative decoding of ``target`` with a :class:`~specbound.decoding.drafters.TreeDrafter`.

    Steps (overridable): :meth:`score` runs the single target ``forward_tree`` pass and returns the
    processed target laws at the root and every read node; :meth:`verify` calls the shared
    verification core with the rule the drafter asks for. Metrics: ``accepted_per_step`` holds X per
    round, ``drafted_per_step`` the number of tree nodes, ``position_*`` count acceptance per depth,
    ``target_calls`` counts verification passes only (an oracle drafter's target reads are
    ``draft_calls``), so ``metrics.tau`` is tokens per verification call. :attr:`rounds` keeps a
    :class:`TreeRound` per round.
    """

    def __init__(self, target: LanguageModel, drafter: TreeDrafter, config: SamplingConfig,
                 generator: torch.Generator):
        if not isinstance(drafter, TreeDrafter):
            raise SpecboundError(f"drafter must be a TreeDrafter, got {type(drafter).__name__}")
        self.target, self.drafter, self.config, self.generator = target, drafter, config, generator
        self.rounds: list[TreeRound] = []

    # ---------------------------------------------------------------- steps
    def score(self, committed: list[int], tree: DraftedTree, remaining: int):
        """ONE target pass over (pending committed tokens, tree nodes of depth < ``remaining``).

        Returns (target_probs [n+1, V], law_mask [n+1], reader, tree→reader index map).
        """
        reader = TreeReader(self.target, committed)
        index: dict[int, int] = {}
        for i, (token, parent, depth) in enumerate(zip(tree.tokens, tree.parents, tree.depths)):
            if depth < remaining:
                index[i] = reader.add(token, -1 if parent < 0 else index[parent])
        read = sorted(index)
        logits = reader.read([-1] + [index[i] for i in read])
        if reader.calls != 1:
            raise SpecboundError(f"internal: verification used {reader.calls} target calls instead of one")
        probs = logits_to_probs(logits, self.config, self.target.name)
        target_probs = torch.zeros((len(tree) + 1, probs.shape[-1]), dtype=probs.dtype)
        law_mask = torch.zeros(len(tree) + 1, dtype=torch.bool)
        target_probs[0], law_mask[0] = probs[0], True
        if read:
            rows = torch.tensor(read) + 1
            target_probs[rows] = probs[1:]
            law_mask[rows] = True
        return target_probs, law_mask, reader, index

    def verify(self, tree: DraftedTree, target_probs: torch.Tensor, law_mask: torch.Tensor) -> TreeVerdict:
        if tree.verification == DETERMINISTIC:
            return verify_tree_deterministic(tree.tokens, tree.parents, target_probs, self.generator, law_mask)
        return verify_tree_multidraft(tree.tokens, tree.parents, tree.draft_probs, target_probs,
                                      self.generator, law_mask)

    # ---------------------------------------------------------------- loop
    def run(self, prompt: list[int], max_new_tokens: int, callback=None) -> DecodeResult:
        """Decode; ``callback(new_token_ids)`` is called with each round's committed tokens (streaming)."""
        metrics = DecodeMetrics()
        self.rounds = []
        committed = [int(t) for t in prompt]
        start = time.perf_counter()
        self.target.reset()
        if len(committed) > 1:
            self.target.forward(torch.tensor([committed[:-1]], dtype=torch.long))
        self.drafter.prefill(committed)
        metrics.prefill_time = time.perf_counter() - start
        end = len(committed) + max_new_tokens
        while len(committed) < end:
            remaining = end - len(committed)
            before = len(committed)
            t0 = time.perf_counter()
            tree = self.drafter.draft(committed, remaining, self.generator)
            t1 = time.perf_counter()
            target_probs, law_mask, reader, index = self.score(committed, tree, remaining)
            t2 = time.perf_counter()
            verdict = self.verify(tree, target_probs, law_mask)
            t3 = time.perf_counter()

            path = verdict.path
            kept = []
            for node in path:                     # the accepted nodes the target has read
                if node not in index:
                    break
                kept.append(index[node])
            reader.keep(kept)
            self.drafter.accept(path)
            self.rounds.append(TreeRound(
                committed=len(committed), size=len(tree), depth=tree.depth, accepted=len(path),
                ended="budget" if verdict.next_token < 0 else ("recovered" if verdict.rejected else "bonus"),
                value=tree.value,
            ))
            committed.extend(tree.tokens[i] for i in path)
            if verdict.next_token >= 0:
                committed.append(verdict.next_token)

            metrics.draft_calls += tree.draft_calls
            metrics.target_calls += 1
            metrics.draft_time += t1 - t0
            metrics.target_time += t2 - t1
            metrics.verify_time += t3 - t2
            # positions are depths here; drafted_per_step counts tree nodes
            metrics.record_round(tree.depth, len(path), verdict.rejected)
            metrics.drafted_per_step[-1] = len(tree)
            if callback is not None:
                callback(committed[before:end])
        metrics.new_tokens = max_new_tokens
        metrics.total_time = time.perf_counter() - start
        return DecodeResult(committed[len(prompt):end], list(prompt), metrics,
                            method=f"tree-speculative ({self.drafter.name}, P={self.drafter.capacity})",
                            lossless=True, sampling=self.config.describe())


def tree_speculative_decode(target: LanguageModel, draft: LanguageModel | None, prompt, max_new_tokens: int,
                            tree: int, tree_drafter: str = "dynamic", temperature: float = 1.0,
                            top_k: int | None = None, top_p: float | None = None, seed=None,
                            callback=None) -> DecodeResult:
    """Lossless tree speculative decoding with capacity P = ``tree`` (Pankratov & Alistarh 2026, §1–§2).

    ``tree_drafter``: ``"dynamic"`` (best-first by draft path probability, EAGLE-2-like,
    deterministic-tree verification), ``"sampled"`` (children sampled from the draft, recursive
    rejection over siblings), ``"chain"`` (one sampled chain of P tokens) or ``"oracle"`` (the target
    drafts its own optimal tree T*(P); ``draft`` may be None). Normally reached through
    :func:`specbound.decoding.speculative_decode` with ``tree=P``. ``callback(new_token_ids)`` is
    called with each round's committed tokens (streaming).
    """
    from .engine import _check_budget, make_generator

    config = SamplingConfig(temperature, top_k, top_p)
    max_new_tokens = _check_budget(max_new_tokens)
    drafter = make_tree_drafter(tree_drafter, target, draft, config, tree)
    prompt_ids = as_token_batch(prompt, target.vocab_size)
    if prompt_ids.shape[0] != 1:
        raise SpecboundError("speculative_decode decodes one prompt at a time (batch 1)")
    engine = TreeSpeculator(target, drafter, config, make_generator(seed))
    return engine.run(prompt_ids[0].tolist(), max_new_tokens, callback=callback)
