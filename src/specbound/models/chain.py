"""Run a :class:`~specbound.theory.MarkovChain` as a :class:`LanguageModel` (exact toy LM).

The token at position i (x_0 is the context token at position 0) is read with transition matrix
``transitions[i]``, whose row gives the law of x_{i+1}; logits are log-probabilities (float64,
−inf for impossible tokens). The cache is only a length: the chain needs no other state.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import SpecboundError
from ..theory.chains import MarkovChain
from .base import CacheTree, ModelInfo, SlotCacheModel

__all__ = ["ChainModel"]


class ChainModel(SlotCacheModel):
    def __init__(self, chain: MarkovChain, name: str = "chain"):
        if not isinstance(chain, MarkovChain):
            raise SpecboundError("ChainModel needs a specbound.theory.MarkovChain")
        self.chain = chain
        self.name = name
        self.vocab_size = chain.n_states
        self.info = ModelInfo(backend="chain", kernels="exact",
                              max_positions=None if chain.stationary else chain.horizon)
        with np.errstate(divide="ignore"):
            self._log_transitions = torch.from_numpy(np.log(chain.transitions))
        self.slots = CacheTree(name)

    def reset(self) -> None:
        self.slots = CacheTree(self.name)

    def crop(self, length: int) -> None:
        self.slots.crop(length)

    def keep_path(self, base_length: int, path) -> None:
        self.slots.keep_path(base_length, path)

    def forward(self, tokens: torch.Tensor, keep_logits: int | None = None) -> torch.Tensor:
        tokens = self.check_tokens(tokens)
        parents = self.slots.chain_parents(tokens.shape[1])
        logits = self._read(tokens, parents, extend_chain=True)
        return logits[:, -keep_logits:] if keep_logits else logits

    def forward_tree(self, tokens: torch.Tensor, parents) -> torch.Tensor:
        tokens = self.check_tokens(tokens)
        parents = self.slots.check_parents(parents)
        if tokens.shape[1] != len(parents):
            raise SpecboundError(f"{self.name}: {tokens.shape[1]} tree tokens but {len(parents)} parents")
        return self._read(tokens, parents, extend_chain=False)

    def _read(self, tokens, parents, extend_chain: bool) -> torch.Tensor:
        base = self.slots.length
        positions = []
        for p in parents:
            positions.append(0 if p < 0 else (self.slots.position(p) if p < base else positions[p - base]) + 1)
        if tokens.shape[1] and not self.chain.stationary and max(positions) >= self.chain.horizon:
            raise SpecboundError(
                f"{self.name}: position {max(positions)} is beyond the chain's horizon "
                f"{self.chain.horizon} (it has no law for the token after it)"
            )
        if self.chain.stationary:
            logits = self._log_transitions[tokens]
        else:
            logits = self._log_transitions[torch.tensor([positions]), tokens]
        self.slots.append(parents, extend_chain=extend_chain)
        return logits
