"""The one small protocol every backend implements, and the cache bookkeeping they share.

A :class:`LanguageModel` keeps a cache of the tokens it has read and, for each new token, returns the
logits of the *next* token. The cache is a tree laid out flat: a *committed chain* (slots ``0 ..
chain_length-1``, the prompt and accepted tokens, each the parent of the next) followed by *tree slots*
whose parents are explicit; every slot has a position (its parent's + 1) and attends to itself and its
ancestors only. ``forward(tokens)`` reads a chain after the last slot; ``forward_tree(tokens, parents)``
reads nodes under any cached slot at or after the last committed one, or under an earlier node of the
same call, so a drafter grows a tree one call per depth without re-reading; ``keep_path(base, path)``
keeps slots ``0..base-1`` plus ``path`` as the committed chain; ``crop(length)`` keeps the first
``length`` slots. The engines never look inside a cache: a rejected token can never stay in one
(docs/design.md, known traps). :class:`CacheTree` holds the parent/position bookkeeping, which each
backend maps to its own mechanism (a 4-D mask for Hugging Face, sequence ids for llama.cpp).
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..errors import SpecboundError

__all__ = ["CacheTree", "LanguageModel", "ModelInfo", "SlotCacheModel", "as_token_batch"]


@dataclass(frozen=True)
class ModelInfo:
    """What a report or a cost cache needs to know about a loaded model (no stray attributes).

    ``identity`` names the weights by content (e.g. a sha256); costs are cached only for models
    that have one, so in-memory and temporary models never write to the user's cost cache.
    """

    backend: str = "custom"            # "chain", "hf", "llamacpp", ...
    kernels: str = "default"           # e.g. "onednn-prepacked", "int8-fbgemm (...)", "eager", "gguf:Q4_K - Medium"
    identity: str | None = None
    load_seconds: float = 0.0
    max_positions: int | None = None   # context length; longer inputs are refused


class CacheTree:
    """Parent and position bookkeeping of a cache: a committed chain, then tree slots.

    Slots ``0 .. chain-1`` form the committed chain (slot i at position i). Each later slot has a
    parent slot and sits at its parent's position + 1. All methods validate their arguments and
    raise :class:`SpecboundError` naming the model.
    """

    def __init__(self, name: str = "model"):
        self.name = name
        self.reset()

    def reset(self) -> None:
        self.chain = 0
        self.parents: list[int] = []      # parent slot of each tree slot (index = slot - chain)
        self.positions: list[int] = []    # position of each tree slot

    @property
    def length(self) -> int:
        return self.chain + len(self.parents)

    @property
    def is_chain(self) -> bool:
        return not self.parents

    def position(self, slot: int) -> int:
        return slot if slot < self.chain else self.positions[slot - self.chain]

    def chain_parents(self, k: int) -> list[int]:
        """Parents of k tokens read as a chain after the last slot."""
        last = self.length - 1
        return list(range(last, last + k))

    def check_parents(self, parents) -> list[int]:
        """Validate absolute parent slots for nodes appended at ``length, length+1, ...``."""
        parents = [int(p) for p in parents]
        base = self.length
        for i, p in enumerate(parents):
            if not (max(self.chain - 1, -1) <= p < base + i) or (p < 0 and base + i > 0):
                raise SpecboundError(
                    f"{self.name}: tree node {i} has parent slot {p}; a parent must be the last committed slot "
                    f"({self.chain - 1}), a tree slot already cached, or an earlier node of the call "
                    f"(slots {self.chain - 1}..{base + i - 1})"
                )
        return parents

    def append(self, parents: list[int], extend_chain: bool = False) -> list[int]:
        """Append nodes with (validated) absolute ``parents``; return their positions.

        With ``extend_chain`` (a plain ``forward`` on a cache without tree slots) the nodes join the
        committed chain; tree forwards always add tree slots until :meth:`keep_path`.
        """
        parents = self.check_parents(parents)
        new_positions = []
        for p in parents:
            pos = 0 if p < 0 else self.position(p) + 1
            if extend_chain and self.is_chain and p == self.length - 1:
                self.chain += 1
            else:
                self.parents.append(p)
                self.positions.append(pos)
            new_positions.append(pos)
        return new_positions

    def ancestors_mask(self, parents: list[int]) -> torch.Tensor:
        """Visibility [n, length + n] (bool) of n nodes about to be appended with ``parents``:
        each sees the committed chain, its cached tree ancestors and its ancestors in the call."""
        n, base = len(parents), self.length
        visible = torch.zeros(n, base + n, dtype=torch.bool)
        visible[:, :self.chain] = True
        for i, p in enumerate(parents):
            slot = base + i
            visible[i, slot] = True
            if p >= base:
                visible[i] |= visible[p - base]
            else:
                a = p
                while a >= self.chain:
                    visible[i, a] = True
                    a = self.parents[a - self.chain]
        return visible

    def crop(self, length: int) -> int:
        length = int(length)
        if not 0 <= length <= self.length:
            raise SpecboundError(f"cannot crop {self.name}'s cache of {self.length} slots to {length}")
        if length <= self.chain:
            self.chain, self.parents, self.positions = length, [], []
        else:
            keep = length - self.chain
            self.parents, self.positions = self.parents[:keep], self.positions[:keep]
        return length

    def keep_path(self, base: int, path) -> list[int]:
        """Validate ``path`` (absolute slots, a chain below slot ``base - 1``); make ``0..base-1`` +
        ``path`` the committed chain. Returns the kept slot indices in order (for gathering)."""
        base, path = int(base), [int(s) for s in path]
        if not 0 <= base <= self.chain:
            raise SpecboundError(
                f"{self.name}: keep_path base {base} must lie within the committed chain (0..{self.chain})"
            )
        previous = base - 1
        for s in path:
            parent = s - 1 if s < self.chain else (self.parents[s - self.chain] if s < self.length else None)
            if parent is None or s <= previous or parent != previous:
                raise SpecboundError(
                    f"{self.name}: keep_path {path} is not a chain of cached slots hanging below slot {base - 1}"
                )
            previous = s
        kept = list(range(base)) + path
        self.chain, self.parents, self.positions = len(kept), [], []
        return kept


class LanguageModel(ABC):
    """Backend protocol: vocabulary size, cached forwards over chains and trees, crop, keep_path."""

    #: Size of the output distribution (number of logits per position).
    vocab_size: int
    #: Human-readable name used in reports.
    name: str = "model"
    #: Backend, kernels, content identity, load time, context length.
    info: ModelInfo = ModelInfo()
    #: Optional tokenizer for text I/O (Hugging Face style: encode/decode).
    tokenizer = None
    #: Most tree nodes this cache can hold beyond its chain (None: no limit). llama.cpp keeps a sequence
    #: per leaf of a cached tree and opens at most 256; drafters that read more nodes than they keep
    #: (the dynamic tree, best-first) stop reading there.
    max_tree_nodes: int | None = None

    @abstractmethod
    def reset(self) -> None:
        """Forget every cached token."""

    @property
    @abstractmethod
    def cache_length(self) -> int:
        """Number of cached slots (the next slot index)."""

    @property
    def committed_length(self) -> int:
        """Length of the committed chain at the start of the cache (== cache_length without a tree)."""
        return self.cache_length

    @abstractmethod
    def forward(self, tokens: torch.Tensor, keep_logits: int | None = None) -> torch.Tensor:
        """Read ``tokens`` [1, k] as a chain after the last slot; return next-token logits [1, k, vocab]
        (only the last ``keep_logits`` positions when given: a prefill needs none of the others)."""

    def prefill(self, tokens, chunk: int = 512) -> None:
        """Forget the cache and read ``tokens`` (a list of ids) in chunks, keeping no logits."""
        self.reset()
        tokens = [int(t) for t in tokens]
        for start in range(0, len(tokens), chunk):
            self.forward(torch.tensor([tokens[start:start + chunk]], dtype=torch.long), keep_logits=1)

    @abstractmethod
    def crop(self, length: int) -> None:
        """Keep only the first ``length`` slots (rollback after a rejection)."""

    def forward_tree(self, tokens: torch.Tensor, parents) -> torch.Tensor:
        """Read n tree nodes in ONE pass; return next-token logits [1, n, vocab].

        ``parents[i]`` is the absolute slot of node i's parent: the last committed slot, a tree slot
        already cached, or an earlier node of this call (which lands in slot ``cache_length + j``).
        Node i sees its ancestors only and sits at its parent's position + 1. Afterwards the cache
        holds the n nodes in call order until :meth:`keep_path` or :meth:`crop`. Batched drafts
        (Yin et al. Alg. 4) and draft trees (Pankratov & Alistarh) both use this one mechanism.
        """
        raise NotImplementedError(f"{self.name} does not support tree forwards")

    def keep_path(self, base_length: int, path) -> None:
        """Keep slots ``0..base_length-1`` plus ``path`` (absolute slots forming a chain below slot
        ``base_length - 1``): the cache becomes that committed chain. The default serves chain-only
        backends (a path that continues the chain is a crop)."""
        path = [int(s) for s in path]
        if path != list(range(base_length, base_length + len(path))):
            raise NotImplementedError(f"{self.name} does not support tree forwards")
        self.crop(base_length + len(path))

    @property
    def supports_trees(self) -> bool:
        return type(self).forward_tree is not LanguageModel.forward_tree

    def fork(self) -> "LanguageModel":
        """A new *row* for batched decoding: the same weights (shared, not copied) behind a cache of its
        own, empty. Backends whose rows can also share one forward pass say so in their ``fork``
        (``models/static.py``); the others decode a batch's rows one after another."""
        raise SpecboundError(f"{self.name} ({self.info.backend} backend) cannot decode several requests at once: "
                             "it has no row of its own to give each request")

    def fork_rows(self, n: int) -> list["LanguageModel"]:
        """``n`` rows for one batch (what batched decoding asks for): ``n`` forks by default; a backend
        whose rows share a pass only when made together (llama.cpp: one context) overrides it."""
        return [self.fork() for _ in range(n)]

    #: whether rows of this model read together in ONE forward (one weight read for all rows) when a
    #: batch's scheduler holds them; otherwise they run one after another (theory.speedup.rows_pass_seconds)
    rows_share_passes: bool = False

    def cache_bytes_per_slot(self) -> int:
        """Bytes one cached token costs a row of this model (0 when the backend does not say): what
        batched decoding checks against the memory available before it forks rows."""
        return 0

    @property
    def supports_batches(self) -> bool:
        return type(self).fork is not LanguageModel.fork


class SlotCacheModel(LanguageModel):
    """A backend whose cache bookkeeping is a :class:`CacheTree` in ``self.slots``."""

    slots: CacheTree

    def fork(self) -> "SlotCacheModel":
        """A new row sharing everything but the cache (see :meth:`LanguageModel.fork`); backends that
        hold more per-cache state than ``reset`` rebuilds override this."""
        row = copy.copy(self)
        row.reset()
        return row

    def check_tokens(self, tokens) -> torch.Tensor:
        """``tokens`` as a LongTensor [1, k] of ids inside the vocabulary, else a clear error."""
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        if tokens.ndim != 2 or tokens.shape[0] != 1:
            raise SpecboundError(f"{self.name}: expected tokens [1, k], got {tuple(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise SpecboundError(f"{self.name}: token ids outside [0, {self.vocab_size})")
        return tokens

    @property
    def cache_length(self) -> int:
        return self.slots.length

    @property
    def committed_length(self) -> int:
        return self.slots.chain


def as_token_batch(tokens, vocab_size: int | None = None, name: str = "prompt") -> torch.Tensor:
    """Turn a list / 1-D / 2-D token sequence into a LongTensor [batch, n] and validate it."""
    if isinstance(tokens, torch.Tensor):
        t = tokens.detach().to(torch.long)
    else:
        try:
            t = torch.as_tensor(tokens, dtype=torch.long)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise SpecboundError(f"{name} must be a sequence of integer token ids ({exc})") from None
    if t.ndim == 1:
        t = t.unsqueeze(0)
    if t.ndim != 2:
        raise SpecboundError(f"{name} must be 1-D or [batch, n], got shape {tuple(t.shape)}")
    if t.shape[1] == 0:
        raise SpecboundError(f"{name} is empty: give at least one token")
    if vocab_size is not None and (int(t.min()) < 0 or int(t.max()) >= vocab_size):
        raise SpecboundError(f"{name} has token ids outside [0, {vocab_size})")
    return t
