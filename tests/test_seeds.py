"""specbound.seeds: one derivation for every random stream, and journals that refuse other derivations."""
import json

import numpy as np
import pytest

from specbound.errors import SpecboundError
from specbound.measure.journal import PartialResults
from specbound.seeds import SEED_SCHEME, derive_seed


def test_the_same_path_gives_the_same_seed_and_other_paths_other_seeds():
    assert derive_seed(0, "moments", 3) == derive_seed(0, "moments", 3)
    assert derive_seed(np.int64(7), "x", np.int32(2)) == derive_seed(7, "x", 2)
    seeds = {derive_seed(seed, name, i, j) for seed in range(4) for name in ("a", "b") for i in range(10)
             for j in range(3)}
    assert len(seeds) == 4 * 2 * 10 * 3                       # no two paths collide
    # the inline arithmetic it replaces did: seed 1000's prompt 0 was seed 0's prompt 1
    assert derive_seed(1000, "moments", 0) != derive_seed(0, "moments", 1)
    # a name never stands for an index, and the path's order matters
    assert derive_seed(0, "a", 1, 2) != derive_seed(0, "a", 2, 1)
    assert derive_seed(0, "1") != derive_seed(0, 1)
    assert derive_seed(0) != derive_seed(0, 0)


def test_derived_seeds_fit_every_consumer():
    import torch

    seed = derive_seed(2**40, "bench", "HumanEval/10", 4)
    assert isinstance(seed, int) and 0 <= seed < 2**63
    torch.Generator().manual_seed(seed + 63)                   # the batch entry adds the request index
    a = np.random.default_rng(seed).random(3)
    assert np.array_equal(a, np.random.default_rng(derive_seed(2**40, "bench", "HumanEval/10", 4)).random(3))


@pytest.mark.parametrize("seed, path", [(-1, ()), (True, ()), (1.5, ()), (0, (-2,)), (0, (1.0,)), (0, (None,)),
                                        (0, (False,))])
def test_bad_seeds_and_paths_are_refused(seed, path):
    with pytest.raises(SpecboundError, match="seed must be|stream path must be"):
        derive_seed(seed, *path)


def test_streams_of_different_paths_are_independent():
    """Paired draws from two paths are uncorrelated; from one path they are identical (common random numbers)."""
    n = 20_000
    a = np.random.default_rng(derive_seed(0, "study", 0)).random(n)
    b = np.random.default_rng(derive_seed(0, "study", 1)).random(n)
    assert abs(np.corrcoef(a, b)[0, 1]) < 4 / np.sqrt(n)
    assert np.array_equal(a, np.random.default_rng(derive_seed(0, "study", 0)).random(n))


def test_journals_record_the_derivation_and_refuse_older_ones(tmp_path):
    path = tmp_path / "partial.jsonl"
    PartialResults(path, {"a": 1}).put("u", [1])
    header = json.loads(path.read_text().splitlines()[0])
    assert header["seeds"] == SEED_SCHEME and header["fingerprint"] == {"a": 1}
    assert PartialResults(path, {"a": 1}, resume=True).units == {"u": [1]}
    # a journal of the previous format drew its units with inline seed arithmetic: refused, clearly
    path.write_text(json.dumps({"specbound_partial": 1, "fingerprint": {"a": 1}}) + "\n"
                    + json.dumps({"key": "u", "data": [1]}) + "\n")
    with pytest.raises(SpecboundError, match="another version of specbound.*without --resume"):
        PartialResults(path, {"a": 1}, resume=True)
    assert len(PartialResults(path, {"a": 1})) == 0             # without --resume: a new journal
