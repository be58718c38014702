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
from .base import LanguageModel, tree_depths

__all__ = ["ChainModel"]


class ChainModel(LanguageModel):
    def __init__(self, chain: MarkovChain, name: str = "chain"):
        if not isinstance(chain, MarkovChain):
            raise SpecboundError("ChainModel needs a specbound.theory.MarkovChain")
        self.chain = chain
        self.name = name
        self.vocab_size = chain.n_states
        with np.errstate(divide="ignore"):
            self._log_transitions = torch.from_numpy(np.log(chain.transitions))
        self._length = 0

    def reset(self) -> None:
        self._length = 0

    @property
    def cache_length(self) -> int:
        return self._length

    def crop(self, length: int) -> None:
        self._length = self._check_crop(length)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        k = torch.as_tensor(tokens).shape[-1]
        return self._read(tokens, torch.arange(self._length, self._length + k))

    def forward_tree(self, tokens: torch.Tensor, parents) -> torch.Tensor:
        depths = torch.tensor(tree_depths(parents), dtype=torch.long)
        return self._read(tokens, self._length + depths - 1)

    def keep_path(self, base_length: int, path: list[int]) -> None:
        self._length = self._check_crop(base_length) + len(path)

    def _read(self, tokens, positions: torch.Tensor) -> torch.Tensor:
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        if tokens.ndim != 2:
            raise SpecboundError(f"{self.name}.forward expects tokens [batch, k], got {tuple(tokens.shape)}")
        k = tokens.shape[1]
        if k and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise SpecboundError(f"{self.name}: token ids outside [0, {self.vocab_size})")
        if self.chain.stationary:
            logits = self._log_transitions[tokens]
        else:
            if k and int(positions.max()) >= self.chain.horizon:
                raise SpecboundError(
                    f"{self.name}: position {int(positions.max())} is beyond the chain's horizon "
                    f"{self.chain.horizon} (it has no law for the token after it)"
                )
            logits = self._log_transitions[positions.unsqueeze(0), tokens]
        self._length += k
        return logits
