"""What every drafter shares: the proposer interface and a draft cache that attaches anywhere.

A drafter (as in Hugging Face's candidate generators) turns the committed tokens into one
:class:`~specbound.decoding.tree.DraftTree` per round; the engine scores it with ONE target pass
and verifies it; the drafter then hears how the round went (:class:`RoundFeedback`) to fix its
cache and learn. Drafters never verify and never touch the target's cache (the oracle, which
reads the target, restores it).

The contract, per round: ``propose(committed, max_depth, generator) -> DraftTree`` leaves the
proposal's nodes in the draft cache; then exactly one of ``observe(feedback)`` (the engine verified
it: keep the accepted path, learn) or ``abandon()`` (nobody will verify it, e.g. an analysis that
only reads the proposal: drop it from the cache). Everything ``observe`` needs from ``propose``
travels in the tree (per-node ``scores``, ``confidences``, ``cache_nodes``) — a drafter keeps no
per-round state of its own.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ...errors import SpecboundError
from ...models.base import LanguageModel
from ..costs import CostModel, load_or_measure_costs
from ..sampling import SamplingConfig
from ..tree import DraftTree
from ..verify import Verdict

__all__ = ["DraftCache", "Drafter", "RoundFeedback"]


@dataclass
class RoundFeedback:
    """How one round went: the tree the drafter proposed (with its per-node fields), the verdict, and
    what it cost. The one object that crosses the engine → drafter seam."""

    tree: DraftTree             # the proposal, as returned by propose (n nodes)
    verdict: Verdict            # accepted path (tree indices), recovered/bonus token, how the round ended
    draft_seconds: float        # propose's wall time
    target_seconds: float       # the one target pass's wall time
    target_tokens: int          # tokens the target read in its one pass (pending committed + tree nodes)
    node_target_probs: torch.Tensor | None = None   # [n] float64: target prob of node i's token at its parent (NaN: not read)
    verify_seconds: float = 0.0                     # verification's wall time
    target_laws: torch.Tensor | None = None         # [n+1, V] the target's processed laws (root, after node i); None
                                                    # when some node was not read (the budget's last depth)


class Drafter(ABC):
    """Proposes one draft tree per round (a chain is a tree of fan-out 1; M drafts are M root branches)."""

    name: str = "drafter"
    model: LanguageModel | None = None
    #: the draft model's cache seen as committed chain + this round's tree (None: no draft model)
    cache: "DraftCache | None" = None
    #: proposes trees that are not chains, so the target must implement ``forward_tree``
    needs_tree_target: bool = False
    #: drafts chains in some rounds and trees in others (``shape="auto"``): a round whose tree is not a
    #: chain is verified by recursive rejection where the chain rule would be block verification
    mixed_shapes: bool = False

    #: seconds the last :meth:`start` spent measuring costs (one-time set-up, not decoding)
    calibration_time: float = 0.0
    #: a calibration given from outside (batched decoding measures once for all requests)
    shared_costs = None
    lazy_prefill = False

    def __init__(self, sampling: SamplingConfig):
        self.sampling = sampling

    def calibrated_costs(self, target: LanguageModel) -> CostModel:
        """The pair's cost model (the cached calibration, else measured now; the time spent measuring
        is kept in :attr:`calibration_time` so reports can show it apart from prefill and decoding)."""
        if self.shared_costs is not None:
            self.calibration_time = 0.0
            return CostModel(self.shared_costs)
        measurement = load_or_measure_costs(target, self.model)
        self.calibration_time = measurement.seconds
        return CostModel(measurement)

    def join_batch(self, shared_costs=None) -> "Drafter":
        """Make this drafter one request of a batch (returns it): its model reads the prompt at its first
        drafted round (:attr:`lazy_prefill`: the batch's prefill is its target rows' prompt reads, for every
        method), and ``shared_costs`` (the batch's cost prior, measured once for all requests), where given,
        sizes its drafts instead of the pair's own calibration."""
        # γ = auto always read the prompt lazily (a batch that decodes plainly never reads it); drafters that
        # read it up front put it in the prefill, so their decode rate left out a cost that auto's carried and
        # plain decoding does not have: at 2 requests (int8 target, llama.cpp draft, HumanEval 160-163) auto
        # and γ = 4 decoded 20.6 tok/s each end to end, but 24.9 vs 27.8 "decode" (2026-12-07)
        self.shared_costs, self.lazy_prefill = shared_costs, True
        return self

    def start(self, target: LanguageModel, prompt: list[int]) -> None:
        """Before the first round: read the prompt (all but its last token) into the draft model —
        or, with :attr:`lazy_prefill` (every request of a batch: its prefill is the target's prompt read), leave it to the
        first round that drafts (:class:`DraftCache` reads whatever the model has not read)."""
        self.calibration_time = 0.0
        if self.model is not None and not self.lazy_prefill:
            self.model.prefill(prompt[:-1])

    @abstractmethod
    def propose(self, committed: list[int], max_depth: int, generator: torch.Generator) -> DraftTree:
        """A draft tree of depth ≤ ``max_depth`` after ``committed`` (the empty tree = a plain step)."""

    def observe(self, feedback: RoundFeedback) -> None:
        """After verification: keep the accepted path in the draft cache, learn from the round."""

    def abandon(self) -> None:
        """Drop the last proposal unverified: the draft cache keeps only the committed chain (the next
        :meth:`propose` starts from there). For analyses that read a proposal without decoding."""
        if self.cache is not None:
            self.cache.restore()

    def finish(self) -> None:
        """After the last round (also after an interrupt): a calibration the run found stale is dropped
        from the cache (the next run measures again)."""
        costs = self.cost_model()
        if costs is not None:
            costs.drop_if_stale()

    def cost_model(self) -> CostModel | None:
        """The pair's cost model this drafter sized its drafts with, corrected by the run (None: a
        drafter of fixed shape, which never calibrates)."""
        budget = getattr(self, "budget", None)
        return budget.costs if budget is not None else None

    def describe(self) -> str:
        return self.name


class DraftCache:
    """A model's cache seen as committed chain + this round's tree: drafter node id → cache slot.

    :meth:`start` reads the committed tokens the model has not read and returns the logits at the
    root (the last committed token); ``chain_only`` (a drafter that only ever extends one chain)
    lets reads use plain forwards; :meth:`read` reads nodes whose parents are the root, cached
    nodes or earlier nodes of the same call — ONE ``forward_tree`` per call, never re-reading an
    ancestor; :meth:`keep` leaves the committed chain plus the longest cached prefix of the accepted
    path; :meth:`restore` drops the tree.
    """

    def __init__(self, model: LanguageModel, chain_only: bool = False):
        self.model, self.chain_only = model, chain_only
        self.slot: dict[int, int] = {}
        self.root_slot = -1
        self.calls = 0
        self.reads: list[tuple[int, float]] = []     # (tokens read, seconds) of this round's calls

    def start(self, committed: list[int]) -> torch.Tensor:
        model = self.model
        model.crop(model.committed_length)
        have = model.committed_length
        if have > len(committed):
            raise SpecboundError(f"internal: {model.name} has read {have} tokens, only {len(committed)} are committed")
        if have == len(committed):           # everything read: re-read the last token for the root law
            if have == 0:
                raise SpecboundError("internal: nothing committed to draft from")
            have -= 1
            model.crop(have)
        t0 = time.perf_counter()
        logits = model.forward(torch.tensor([committed[have:]], dtype=torch.long), keep_logits=1)[0, -1]
        self.reads = [(len(committed) - have, time.perf_counter() - t0)]
        self.slot, self.root_slot, self.calls = {}, model.cache_length - 1, 1
        return logits

    def read(self, nodes: list[int], tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Logits [len(nodes), V] after drafter nodes ``nodes`` with ``tokens`` and parent node ids
        ``parents`` (−1 = root; a parent is cached already or earlier in this call)."""
        base = self.model.cache_length
        slots = []
        for i, (node, parent) in enumerate(zip(nodes, parents)):
            if parent < 0:
                slots.append(self.root_slot)
            elif parent in self.slot:
                slots.append(self.slot[parent])
            else:
                raise SpecboundError(f"internal: parent node {parent} of node {node} was not read")
            self.slot[node] = base + i
        batch = torch.tensor([tokens], dtype=torch.long)
        t0 = time.perf_counter()
        if self._extends_chain(slots, base):      # a chain continuing the cache: no tree mask needed
            logits = self.model.forward(batch)[0]
        else:
            logits = self.model.forward_tree(batch, slots)[0]
        self.reads.append((len(tokens), time.perf_counter() - t0))
        self.calls += 1
        return logits

    def _extends_chain(self, slots: list[int], base: int) -> bool:
        """Chain-only users (the chain drafter) read with plain forwards: the drafted tokens extend the
        committed chain until :meth:`keep` (no tree mask). Tree users must not: a later node could
        attach under an earlier slot, which a committed chain no longer allows."""
        model = self.model
        return self.chain_only and model.committed_length == base and all(s == base - 1 + i for i, s in enumerate(slots))

    def keep(self, path: list[int]) -> None:
        kept = []
        for node in path:
            if node not in self.slot:
                break
            kept.append(self.slot[node])
        self.model.keep_path(self.root_slot + 1, kept)
        self.slot = {}

    def restore(self) -> None:
        self.model.crop(self.root_slot + 1)
        self.slot = {}
