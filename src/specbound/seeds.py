"""Seeds: the one rule that turns the user's ``--seed`` into the seed of every random stream.

Randomness policy (docs/design.md, "Seeds"):

* **Every independent stream is named by its path**: the user's seed plus a tuple of names and
  indices saying what the stream is for — the measurement or study first, then the unit: prompt
  index, sample, capacity P, … (``derive_seed(seed, "moments", 3)``: the sample of prompt 3).
  :func:`derive_seed` hashes the path with NumPy's ``SeedSequence(seed, spawn_key=path)`` (the
  hashing NumPy's own ``spawn`` uses), so
* **streams with different paths are independent** (for every practical purpose: 63-bit seeds from a
  cryptographic-strength mixing of the whole path). Inline arithmetic such as ``seed + 1000·i`` is
  not: seed 1000's prompt 0 was seed 0's prompt 1, and ``seed + P`` of one capacity was another
  prompt's ``seed + P'``.
* **The same path gives the same stream**: reruns and ``--resume`` reproduce every unit.
* **Paired comparisons share a path on purpose** (common random numbers: a unit that is hard for one
  method is hard for the other, so the difference is not blurred by independent noise). The pairings
  in specbound:

  - ``bench``: every method of one (prompt, repeat s) unit decodes with the same seed;
  - Yin Table 1: OPT and UNO — and every form and ε — of one (prompt, sample) unit share one seed, so
    they make the same decisions until their first rejection;
  - Yin Fig. 4 core Monte Carlo: OPT and UNO (and both forms) at one ε index share the drafted tokens
    and uniforms;
  - tree SD with real drafters (``measure.drafter_values.drafter_runs``): every drafter kind at one
    (prompt, P) decodes with the same seed;
  - ``advise``: plain decoding and every measured setting of one held-out prompt share a seed; the
    greedy and sampled acceptance runs of one calibration prompt share one.

* **Problem instances are not streams.** The random chain pair of ``specbound theory`` and Yin Fig. 2
  is ``MarkovChain.random(..., seed)`` with the draft ``target.perturbed(noise, seed + 1)``, and
  Fig. 4's instance is drawn from ``default_rng([seed, 4, vocab])``: they define the problem that
  the published numbers (docs/results/) were computed on, so they stay as they are.
* ``decoding/`` derives nothing: a caller passes one seed per decode, and the batch entry gives
  request i the seed ``seed + i`` (a user contract: request 0 decodes exactly as it would alone).

Pure Python and NumPy, importable from every layer.
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
