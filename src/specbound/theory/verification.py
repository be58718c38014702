"""Block verification of one drafted chain (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh,
*Block Verification Accelerates Speculative Decoding*, ICLR 2025, Alg. 2), and the exact expected
number of accepted tokens per round on Markov chains under token-wise and block verification.

Token-wise verification (Yin et al. 2024, Alg. 1) accepts drafted token i with probability
b_i = min(1, target_i(x_i)/draft_i(x_i)) and stops at the first rejection. Block verification weighs the
whole block X_1..X_γ: p_0 = 1, p_i = min(1, p_{i−1}·target_i(X_i)/draft_i(X_i)); stopping probabilities
h_γ = p_γ, h_i = S_i / (S_i + 1 − p_i) with S_i = Σ_x [p_i·target_{i+1}(x) − draft_{i+1}(x)]_+ (h_0 = 1);
one uniform η_i per position, the kept prefix τ = max{i : η_i ≤ h_i}; the next token from target_{γ+1}
when τ = γ (bonus), else from [p_τ·target_{τ+1} − draft_{τ+1}]_+ normalised (recovered). The output law
is the target's and the expected kept length never below token-wise verification's (γ = 1: the same).
Why it lies outside Yin et al.'s Thm 2 class: docs/paper-notes.md, §Block verification. ``target`` /
``draft`` rows are the processed laws before each drafted token (``target`` has one more row: the law
after the last one); all arrays float64. In full: docs/notes.md (`theory/verification.py`).
"""
from __future__ import annotations

import itertools

import numpy as np

from ..errors import SpecboundError
from .chains import MarkovChain

__all__ = [
    "VERIFICATIONS", "block_accepted_by_length", "block_residual", "block_stop_probabilities", "block_weights",
    "expected_accepted", "token_stop_probabilities",
]

#: Verification rules of a drafted chain: token-wise (Yin et al. 2024, Alg. 1) and block (Sun et al. 2025, Alg. 2).
VERIFICATIONS = ("token", "block")
_MAX_BLOCKS = 2_000_000


def _check_block(target, draft, tokens):
    target, draft = np.asarray(target, dtype=np.float64), np.asarray(draft, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.int64)
    gamma = tokens.shape[0]
    if tokens.ndim != 1 or draft.ndim != 2 or target.ndim != 2 or draft.shape[0] < gamma \
            or target.shape[0] != gamma + 1 or target.shape[1] != draft.shape[1]:
        raise SpecboundError(f"a drafted block of γ tokens needs target laws [γ+1, V] and draft laws [≥γ, V]; got "
                             f"tokens {tokens.shape}, target {target.shape}, draft {draft.shape}")
    return target, draft[:max(gamma, 1)], tokens


def block_weights(*, target, draft, tokens) -> np.ndarray:
    """p_0..p_γ of block verification (Sun et al. 2025, Alg. 2): p_0 = 1,
    p_i = min(1, p_{i−1}·target_i(X_i)/draft_i(X_i)). ``tokens`` were drawn from ``draft``."""
    target, draft, tokens = _check_block(target, draft, tokens)
    p = np.ones(tokens.shape[0] + 1)
    for i, x in enumerate(tokens):
        q = draft[i, x]
        p[i + 1] = 1.0 if q <= 0 else min(1.0, p[i] * target[i, x] / q)
    return p


def block_stop_probabilities(*, target, draft, tokens) -> tuple[np.ndarray, np.ndarray]:
    """(h, P(τ = i | X)) for i = 0..γ under block verification (Sun et al. 2025, Alg. 2).

    h_0 = 1, h_γ = p_γ, h_i = S_i/(S_i + 1 − p_i) with S_i = Σ_x [p_i·target_{i+1}(x) − draft_{i+1}(x)]_+
    (0 when S_i = 0: a prefix whose residual has no mass is never where the block stops).
    τ = max{i : η_i ≤ h_i} with independent uniforms η_i, so P(τ = i) = h_i·Π_{j>i}(1 − h_j)."""
    target, draft, tokens = _check_block(target, draft, tokens)
    gamma = tokens.shape[0]
    p = block_weights(target=target, draft=draft, tokens=tokens)
    h = np.ones(gamma + 1)
    for i in range(1, gamma):
        s = np.maximum(p[i] * target[i] - draft[i], 0.0).sum()
        den = s + 1.0 - p[i]
        h[i] = s / den if den > 0 else 0.0
    if gamma:
        h[gamma] = p[gamma]
    return h, _stop_probabilities(h)


def _stop_probabilities(h: np.ndarray) -> np.ndarray:
    """P(τ = i) = h_i·Π_{j>i}(1 − h_j), i = 0..γ, for τ = max{i : η_i ≤ h_i} (independent uniforms η_i)."""
    stay = np.cumprod((1.0 - h)[::-1])[::-1]                        # Π_{j ≥ i} (1 − h_j)
    after = np.append(stay[1:], 1.0)                                 # Π_{j > i} (1 − h_j)
    return h * after


def block_accepted_by_length(*, target, draft, tokens) -> np.ndarray:
    """E[τ | the block's first n tokens] for n = 1..γ under block verification (Sun et al. 2025, Alg. 2):
    the exact expected accepted tokens of every shorter block cut from one drafted chain.

    h_i (i < n) depends only on the prefix up to i, so a block cut at n keeps h_1..h_{n−1} of the full
    block and ends with h_n = p_n (:func:`block_stop_probabilities`); E_n = Σ_i i·h_i·Π_{j>i}(1 − h_j)."""
    target, draft, tokens = _check_block(target, draft, tokens)
    gamma = tokens.shape[0]
    h, _ = block_stop_probabilities(target=target, draft=draft, tokens=tokens)
    p = block_weights(target=target, draft=draft, tokens=tokens)
    out = np.zeros(gamma)
    for n in range(1, gamma + 1):
        out[n - 1] = float(np.dot(np.arange(n + 1), _stop_probabilities(np.append(h[:n], p[n]))))
    return out


def block_residual(*, target, draft, weight: float) -> np.ndarray:
    """The recovered token's law after keeping a prefix with weight p: [p·target − draft]_+ normalised
    (Sun et al. 2025, Alg. 2); with p = 1 it is the standard residual. The target where it has no mass."""
    target, draft = np.asarray(target, dtype=np.float64), np.asarray(draft, dtype=np.float64)
    excess = np.maximum(weight * target - draft, 0.0)
    mass = excess.sum()
    return excess / mass if mass > 0 else target


def token_stop_probabilities(*, target, draft, tokens) -> np.ndarray:
    """P(τ = i | X), i = 0..γ, under token-wise verification (Yin et al. 2024, Alg. 1):
    Π_{j ≤ i} b_j · (1 − b_{i+1}), b_j = min(1, target_j(X_j)/draft_j(X_j))."""
    target, draft, tokens = _check_block(target, draft, tokens)
    gamma = tokens.shape[0]
    q = draft[np.arange(gamma), tokens]
    b = np.where(q > 0, np.minimum(1.0, target[np.arange(gamma), tokens] / np.where(q > 0, q, 1.0)), 1.0)
    reach = np.concatenate([[1.0], np.cumprod(b)])
    return reach * np.append(1.0 - b, 1.0)


def _laws(chain: MarkovChain, position: int, gamma: int) -> np.ndarray:
    """Transition matrices for the drafted steps position .. position+γ−1."""
    return np.stack([chain.transition(position + i) for i in range(gamma)])


def expected_accepted(*, target: MarkovChain, draft: MarkovChain, gamma: int, verification: str = "token",
                      start=None, position: int = 0) -> float:
    """Exact E[accepted drafted tokens] of one round that drafts γ tokens, on Markov chains.

    The round starts after token x (``start``: a state, or a law over states; default the target's
    ``initial`` law) at step ``position``; the draft chain proposes X_1..X_γ, verified token-wise
    (Yin et al. 2024, Alg. 1: E = Σ_i Π_{j≤i} b_j) or by block verification (Sun et al. 2025, Alg. 2).
    Enumerates every drafted block (V^γ of them; refused above 2·10⁶). Tokens per round = this + 1."""
    if verification not in VERIFICATIONS:
        raise SpecboundError(f"verification must be one of {', '.join(VERIFICATIONS)}, got {verification!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or gamma < 1:
        raise SpecboundError(f"gamma must be an integer >= 1, got {gamma!r}")
    states = target.n_states
    if draft.n_states != states:
        raise SpecboundError(f"target has {states} states, draft {draft.n_states}: one vocabulary is needed")
    if states ** gamma > _MAX_BLOCKS:
        raise SpecboundError(f"{states}^{gamma} drafted blocks is too many to enumerate (limit {_MAX_BLOCKS})")
    if start is None:
        start_law = target.initial
    elif np.ndim(start) == 0:
        start_law = np.eye(states)[int(start)]
    else:
        start_law = np.asarray(start, dtype=np.float64)
    t_steps, d_steps = _laws(target, position, gamma), _laws(draft, position, gamma)
    stop = block_stop_probabilities if verification == "block" else token_stop_probabilities
    lengths = np.arange(gamma + 1)
    total = 0.0
    for x0 in np.flatnonzero(start_law > 0):
        for block in itertools.product(range(states), repeat=gamma):
            path = (x0,) + block
            q_block = np.prod([d_steps[i, path[i], path[i + 1]] for i in range(gamma)])
            if q_block == 0:
                continue
            target_rows = t_steps[np.arange(gamma), list(path[:-1])]
            target_rows = np.vstack([target_rows, target_rows[-1:]])    # the bonus law: not needed for τ
            draft_rows = d_steps[np.arange(gamma), list(path[:-1])]
            result = stop(target=target_rows, draft=draft_rows, tokens=np.array(block))
            probs = result[1] if isinstance(result, tuple) else result
            total += start_law[x0] * q_block * float(probs @ lengths)
    return float(total)
