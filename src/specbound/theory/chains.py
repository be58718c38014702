"""Finite-state Markov chains as exact toy language models (Yin et al. 2024, §1 Markov-chain view).

States are tokens. ``initial`` is the law of the context token x_0; ``transitions[n]`` (row = x_n)
generates x_{n+1}. A stationary chain has one S×S matrix; a non-stationary chain has T of them,
which fixes its horizon T.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from ..errors import SpecboundError
from .distributions import as_distribution

__all__ = ["MarkovChain"]


def _rng(seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


@dataclass(frozen=True, init=False)
class MarkovChain:
    """A finite-state (possibly non-stationary) Markov chain used as an exact toy language model.

    Yin et al. 2024, §1 (Markov-chain view of decoding; their Fig. 2 simulations use a random
    non-stationary 7-state chain). ``initial`` (S,) is the law of x_0, ``transitions`` is (S, S)
    (stationary) or (T, S, S) (non-stationary, horizon T); rows are next-token laws.
    """

    initial: np.ndarray
    transitions: np.ndarray

    def __init__(self, initial, transitions):
        initial = as_distribution(initial, "initial")
        if initial.ndim != 1:
            raise SpecboundError(f"initial must be a vector of length S, got shape {initial.shape}")
        transitions = np.asarray(transitions, dtype=np.float64)
        s = initial.shape[0]
        if transitions.ndim not in (2, 3) or transitions.shape[-2:] != (s, s):
            raise SpecboundError(
                f"transitions must be shaped (S, S) or (T, S, S) with S = {s} (len(initial)); "
                f"got {transitions.shape}"
            )
        if transitions.ndim == 3 and transitions.shape[0] == 0:
            raise SpecboundError("a non-stationary chain needs at least one transition matrix (T >= 1)")
        transitions = as_distribution(transitions, "transitions (each row)")
        initial.setflags(write=False)
        transitions.setflags(write=False)
        object.__setattr__(self, "initial", initial)
        object.__setattr__(self, "transitions", transitions)

    # ------------------------------------------------------------------ shape
    @property
    def n_states(self) -> int:
        return self.initial.shape[0]

    @property
    def stationary(self) -> bool:
        return self.transitions.ndim == 2

    @property
    def horizon(self) -> int | None:
        """Largest T this chain can generate to (None: unbounded, stationary chain)."""
        return None if self.stationary else self.transitions.shape[0]

    def check_horizon(self, horizon: int) -> int:
        """``horizon`` as an int T ≥ 0 that this chain can generate to, else a clear error."""
        if isinstance(horizon, bool) or type(horizon).__name__ == "bool_":
            raise SpecboundError(f"horizon must be an integer >= 0, got {horizon!r}")
        try:
            horizon = operator.index(horizon)
        except TypeError:
            raise SpecboundError(
                f"horizon must be an integer >= 0, got {horizon!r} of type {type(horizon).__name__}"
            ) from None
        if horizon < 0:
            raise SpecboundError(f"horizon must be >= 0, got {horizon}")
        if self.horizon is not None and horizon > self.horizon:
            raise SpecboundError(
                f"horizon {horizon} exceeds the chain's {self.horizon} transition matrices"
            )
        return horizon

    def transition(self, n: int) -> np.ndarray:
        """Matrix generating x_{n+1} from x_n."""
        if self.stationary:
            return self.transitions
        if not 0 <= n < self.transitions.shape[0]:
            raise SpecboundError(f"step {n} is outside the chain's horizon {self.horizon}")
        return self.transitions[n]

    def stack(self, horizon: int) -> np.ndarray:
        """The first ``horizon`` transition matrices as a (T, S, S) array."""
        horizon = self.check_horizon(horizon)
        if self.stationary:
            return np.broadcast_to(self.transitions, (horizon, self.n_states, self.n_states))
        return self.transitions[:horizon]

    # ------------------------------------------------------------------ exact laws
    def marginals(self, horizon: int) -> np.ndarray:
        """Exact laws of x_0..x_T as a (T+1, S) array: μ_{n+1} = μ_n · transitions[n]."""
        mats = self.stack(horizon)
        out = np.empty((len(mats) + 1, self.n_states))
        out[0] = self.initial
        for n, mat in enumerate(mats):
            out[n + 1] = out[n] @ mat
        return out

    def sequence_law(self, context: int, length: int) -> np.ndarray:
        """Exact joint law of (x_1..x_length) given x_0 = context, shaped (S,)*length."""
        mats = self.stack(length)
        law = mats[0][context].copy() if length else np.ones(())
        for n in range(1, length):
            law = law[..., :, None] * mats[n]
        return law

    # ------------------------------------------------------------------ sampling
    def sample(self, horizon: int, size: int = 1, seed=None) -> np.ndarray:
        """Sample ``size`` paths x_0..x_T, shaped (size, T+1)."""
        rng = _rng(seed)
        mats = self.stack(horizon)
        out = np.empty((size, len(mats) + 1), dtype=np.int64)
        out[:, 0] = rng.choice(self.n_states, size=size, p=self.initial)
        for n, mat in enumerate(mats):
            cdf = np.cumsum(mat[out[:, n]], axis=1)
            u = rng.random(size)[:, None] * cdf[:, -1:]
            out[:, n + 1] = (u >= cdf).sum(axis=1).clip(max=self.n_states - 1)
        return out

    # ------------------------------------------------------------------ construction
    @classmethod
    def random(
        cls,
        n_states: int,
        horizon: int | None = None,
        concentration: float = 0.5,
        seed=None,
    ) -> "MarkovChain":
        """Random chain with Dirichlet(concentration) rows; ``horizon=None`` gives a stationary chain.

        Small concentration gives peaked (low-entropy) rows, large concentration near-uniform ones.
        """
        if n_states < 1:
            raise SpecboundError(f"n_states must be >= 1, got {n_states}")
        if concentration <= 0:
            raise SpecboundError(f"concentration must be > 0, got {concentration}")
        rng = _rng(seed)
        alpha = np.full(n_states, float(concentration))
        initial = rng.dirichlet(alpha)
        shape = (n_states,) if horizon is None else (int(horizon), n_states)
        rows = rng.dirichlet(alpha, size=shape)
        return cls(initial, rows)

    def perturbed(self, strength: float, seed=None) -> "MarkovChain":
        """A draft-like neighbour: each row mixed with a random Dirichlet row, weight ``strength``."""
        if not 0 <= strength <= 1:
            raise SpecboundError(f"strength must be in [0, 1], got {strength}")
        rng = _rng(seed)
        mixed = rng.dirichlet(np.ones(self.n_states), size=self.transitions.shape[:-1])
        mixed *= strength                              # in place: one extra array, not three
        mixed += (1 - strength) * self.transitions
        return MarkovChain(self.initial, mixed)
