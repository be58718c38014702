"""The one small protocol every backend implements.

A :class:`LanguageModel` keeps a cache of the tokens it has already read (identical across the
rows of a batch) and, for each new token, returns the logits of the *next* token. The engines
never look inside the cache: they only ask for its length and crop it after a rejection, so a
stale entry for a rejected token can never survive (DESIGN.md, known traps).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..errors import SpecboundError

__all__ = ["LanguageModel", "as_token_batch", "tree_depths"]


def tree_depths(parents) -> list[int]:
    """Depth (1 = child of the cached prefix) of each node of a tree given by parent indices."""
    depths: list[int] = []
    for i, parent in enumerate(parents):
        parent = int(parent)
        if not -1 <= parent < i:
            raise SpecboundError(f"tree node {i} has parent {parent}: parents must precede children")
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


class LanguageModel(ABC):
    """Backend protocol: vocabulary size, cached forward, crop."""

    #: Size of the output distribution (number of logits per position).
    vocab_size: int
    #: Human-readable name used in reports.
    name: str = "model"

    @abstractmethod
    def reset(self) -> None:
        """Forget every cached token."""

    @property
    @abstractmethod
    def cache_length(self) -> int:
        """Number of tokens already read (the next token read sits at this position)."""

    @abstractmethod
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Read ``tokens`` [batch, k] after the cache; return next-token logits [batch, k, vocab]."""

    @abstractmethod
    def crop(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (rollback after a rejection)."""

    def forward_tree(self, tokens: torch.Tensor, parents) -> torch.Tensor:
        """Read a tree of n tokens after the cache in ONE pass; return next-token logits [batch, n, vocab].

        ``parents[i]`` is the index (in this call) of node i's parent, or −1 when its parent is the
        last cached token; parents come before children. Node i sees the cache and its ancestors
        only and sits at position cache_length + depth(i). Afterwards the cache holds all n nodes in
        order until :meth:`keep_path` (or :meth:`crop`) is called. Batched drafts (Yin et al.
        Alg. 4) and draft trees (Pankratov & Alistarh) both use this one mechanism.
        """
        raise NotImplementedError(f"{self.name} does not support tree forwards")

    def keep_path(self, base_length: int, path: list[int]) -> None:
        """After :meth:`forward_tree` from ``base_length``, keep only the nodes ``path`` (a root-to-node
        chain of tree indices, in order): the cache becomes the committed prefix + that path."""
        raise NotImplementedError(f"{self.name} does not support tree forwards")

    def _check_crop(self, length: int) -> int:
        if not 0 <= length <= self.cache_length:
            raise SpecboundError(f"cannot crop {self.name}'s cache of {self.cache_length} tokens to {length}")
        return int(length)


def as_token_batch(tokens, vocab_size: int | None = None, name: str = "prompt") -> torch.Tensor:
    """Turn a list / 1-D / 2-D token sequence into a LongTensor [batch, n] and validate it."""
    if isinstance(tokens, torch.Tensor):
        t = tokens.detach().to(torch.long)
    else:
        try:
            t = torch.as_tensor(tokens, dtype=torch.long)
        except (TypeError, ValueError) as exc:
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
