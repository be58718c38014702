"""Seeds: the one rule that turns the user's ``--seed`` into the seed of every random stream.

Randomness policy (docs/design.md, "Seeds"): every independent stream is named by its path — the user's
seed plus names and indices saying what it is for, the measurement or study first, then the unit
(``derive_seed(seed, "moments", 3)``: the sample of prompt 3). :func:`derive_seed` hashes the path with
NumPy's ``SeedSequence(seed, spawn_key=path)``, so streams with different paths are independent (inline
arithmetic such as ``seed + 1000·i`` is not) and the same path gives the same stream (reruns and
``--resume``). Paired comparisons share a path on purpose (common random numbers: the methods of one
bench unit, Yin Table 1's OPT and UNO, …). Problem instances are not streams: the random chain pairs
and Fig. 4's instance keep the seeds the published numbers were computed on. ``decoding/`` derives
nothing: a caller passes one seed per decode, and the batch entry gives request i the seed ``seed + i``.
Pure Python and NumPy, importable from every layer. Every pairing: docs/notes.md (`seeds.py`).
"""
from __future__ import annotations

import zlib

import numpy as np

from .errors import int_at_least

__all__ = ["SEED_SCHEME", "derive_seed"]

#: Name of this derivation; journals written under another one are not resumed (``measure.journal``).
SEED_SCHEME = "SeedSequence(seed, spawn_key=path)"

_STRING = 1 << 32        # strings hash to crc32 + 2**32: never equal to an index below 2**32


def _word(part) -> int:
    if isinstance(part, str):
        return _STRING + zlib.crc32(part.encode("utf-8"))
    return int_at_least(part, 0, "each index of a stream path")


def derive_seed(seed, *stream) -> int:
    """The seed of the random stream named ``stream`` under the user's ``seed`` (see the module's
    policy): ``SeedSequence(seed, spawn_key=stream)`` with every string of the path mapped to
    ``zlib.crc32(name) + 2**32``. Returns an integer in [0, 2**63), good for ``torch.Generator``,
    ``numpy.random.default_rng`` and the engine's ``seed=``; the same arguments always give the same
    value. ``seed`` must be an integer >= 0, the path's parts strings or integers >= 0."""
    key = tuple(_word(part) for part in stream)
    state = np.random.SeedSequence(int_at_least(seed, 0, "seed"), spawn_key=key).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))
