"""The context index (specbound.decoding.context): continuations of the longest earlier occurrence of
the suffix, checked against a brute-force search written here; bounded memory; sync rebuilds on edits."""
import random

import pytest

from specbound.decoding.context import ContextIndex
from specbound.errors import SpecboundError


def brute_force(seq, max_tokens, min_match, max_match):
    """The longest n in [min_match, max_match] whose last-n suffix occurred earlier, and the tokens after
    its most recent earlier occurrence."""
    for n in range(min(max_match, len(seq) - 1), min_match - 1, -1):
        suffix = seq[len(seq) - n:]
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start:start + n] == suffix:
                return n, tuple(seq[start + n:start + n + max_tokens])
    return 0, ()


@pytest.mark.parametrize("seed", range(6))
def test_proposals_equal_a_brute_force_search(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 12])
    seq = [rng.randrange(vocab) for _ in range(300)]
    index = ContextIndex(min_match=2, max_match=6, per_key=1 << 30)
    for i in range(1, len(seq) + 1):
        index.sync(seq[:i])
        got = index.propose(5)
        n, tokens = brute_force(seq[:i], 5, 2, 6)
        assert (got.match, got.tokens) == (n, tokens), i
        if got.tokens:
            assert got.agree[0] >= 1 and got.occurrences >= 1


def test_repeated_text_is_proposed_and_memory_is_bounded():
    text = [7, 8, 9, 10, 11, 12] * 3 + [7, 8]
    index = ContextIndex(min_match=2, max_match=4, per_key=2)
    index.extend(text)
    p = index.propose(4)
    assert p.tokens == (9, 10, 11, 12) and p.match == 4 and p.agree == (2, 2, 2, 2)
    assert all(len(v) <= 2 for v in index._next.values())
    assert ContextIndex().propose(3).tokens == ()


def test_sync_rebuilds_when_the_committed_tokens_are_not_an_extension():
    index = ContextIndex(min_match=1, max_match=2)
    index.sync([1, 2, 3, 1])
    assert index.propose(2).tokens == (2, 3)
    index.sync([5, 6, 5])                     # another sequence (a new request): rebuilt
    assert index.tokens == [5, 6, 5] and index.propose(1).tokens == (6,)


def test_bad_settings_are_refused():
    with pytest.raises(SpecboundError, match="min_match"):
        ContextIndex(min_match=3, max_match=2)
    with pytest.raises(SpecboundError, match="per_key"):
        ContextIndex(per_key=0)
