"""Draft tokens for free: continuations of the context found in the context itself.

Code repeats its identifiers, a math answer the question's numbers, a rewrite the text it rewrites, a
second chat turn the first. :class:`ContextIndex` keeps the prompt and every committed token with, for
each n-gram of n ∈ [``min_match``, ``max_match``] tokens, the positions that follow its latest
occurrences (at most ``per_key`` each, so memory stays bounded by ``max_match · per_key`` entries per
token); :meth:`ContextIndex.extend` costs O(new tokens · max_match). :meth:`ContextIndex.propose`
looks up the longest suffix of the context seen before and returns the tokens that followed it (the
most recent occurrence), with the match length and how many occurrences agree on each token — what a
drafter turns into a confidence. Proposals are a function of the context alone (no randomness), so a
verifier may treat each proposed token as drawn from a one-hot law: lossless under every rule.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..errors import SpecboundError

__all__ = ["ContextIndex", "ContextProposal"]


@dataclass(frozen=True)
class ContextProposal:
    """Tokens that followed the longest earlier occurrence of the context's suffix."""

    tokens: tuple[int, ...]     # the continuation (empty: no match)
    match: int                  # length of the matched suffix (0: no match)
    agree: tuple[int, ...]      # per token: how many of the occurrences found continue with it
    occurrences: int            # occurrences of the matched suffix that were compared


class ContextIndex:
    """An n-gram index over one sequence of tokens (see the module docstring)."""

    def __init__(self, *, min_match: int = 2, max_match: int = 8, per_key: int = 4, max_tokens: int = 1 << 20):
        if not 1 <= min_match <= max_match:
            raise SpecboundError(f"need 1 <= min_match <= max_match, got {min_match} and {max_match}")
        if per_key < 1 or max_tokens < 1:
            raise SpecboundError("per_key and max_tokens must be >= 1")
        self.min_match, self.max_match, self.per_key, self.max_tokens = min_match, max_match, per_key, max_tokens
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], deque] = {}     # n-gram -> positions right after its occurrences

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens) -> None:
        """Append ``tokens`` and index every n-gram that now ends before the last token."""
        for token in tokens:
            self.tokens.append(int(token))
            end = len(self.tokens) - 1              # the n-grams ending at end - 1 are followed by position end
            for n in range(self.min_match, self.max_match + 1):
                if end - n < 0:
                    break
                key = tuple(self.tokens[end - n:end])
                slot = self._next.get(key)
                if slot is None:
                    slot = self._next[key] = deque(maxlen=self.per_key)
                slot.append(end)
        if len(self.tokens) > self.max_tokens:
            raise SpecboundError(f"the context index holds at most {self.max_tokens} tokens")

    def sync(self, committed) -> None:
        """Make the index hold exactly ``committed`` when it extends what is indexed (the usual case:
        accepted tokens appended); anything else rebuilds it."""
        n = len(self.tokens)
        if len(committed) >= n and list(committed[:n]) == self.tokens:
            self.extend(committed[n:])
            return
        self.tokens, self._next = [], {}
        self.extend(committed)

    def propose(self, max_tokens: int) -> ContextProposal:
        """Up to ``max_tokens`` tokens that followed the longest earlier occurrence (≥ ``min_match``
        tokens) of the sequence's own suffix; the most recent occurrence supplies them."""
        seq = self.tokens
        for n in range(min(self.max_match, len(seq) - 1), self.min_match - 1, -1):
            found = self._next.get(tuple(seq[len(seq) - n:]))
            if not found:
                continue
            starts = [p for p in found if p < len(seq)]
            if not starts:
                continue
            best = starts[-1]
            out = tuple(seq[best:best + max_tokens])
            if not out:
                continue
            agree = tuple(sum(1 for p in starts if p + j < len(seq) and seq[p + j] == t) for j, t in enumerate(out))
            return ContextProposal(out, n, agree, len(starts))
        return ContextProposal((), 0, (), 0)


# ------------------------------------------------------------------ what a context-drafted token is worth
MATCH_EDGES = (3, 4, 6, 9, 17)        # match lengths 2 | 3 | 4-5 | 6-8 | 9-16 | 17+
DEPTH_EDGES = (2, 3, 5, 9, 17)        # depths 1 | 2 | 3-4 | 5-8 | 9-16 | 17+


def _bucket(value: int, edges) -> int:
    return sum(value >= e for e in edges)


class ContextCalibration:
    """P(the target takes a context-drafted token | its prefix was taken), by match length and depth:
    a Beta(``prior_hits``, ``prior_misses``) prior per bucket updated with the target's probability of
    every verified node (its exact acceptance probability: at T = 0 one or zero, at T > 0 the target's
    law at the node, since a deterministic proposal is accepted with probability p_target)."""

    def __init__(self, prior_hits: float = 1.0, prior_misses: float = 1.0):
        shape = (len(MATCH_EDGES) + 1, len(DEPTH_EDGES) + 1)
        self.hits = [[prior_hits] * shape[1] for _ in range(shape[0])]
        self.seen = [[prior_hits + prior_misses] * shape[1] for _ in range(shape[0])]

    def rate(self, match: int, depth: int) -> float:
        m, d = _bucket(match, MATCH_EDGES), _bucket(depth, DEPTH_EDGES)
        return self.hits[m][d] / self.seen[m][d]

    def rates(self, match: int, n: int) -> list[float]:
        return [self.rate(match, depth) for depth in range(1, n + 1)]

    def learn(self, match: int, accept) -> None:
        """``accept[j]``: the acceptance probability of the node at depth j + 1 given its proposed prefix."""
        m = _bucket(match, MATCH_EDGES)
        for depth, a in enumerate(accept, start=1):
            if a == a:                                       # NaN: a node the target did not read
                d = _bucket(depth, DEPTH_EDGES)
                self.hits[m][d] += float(a)
                self.seen[m][d] += 1.0
