"""The acceptance a pair has shown, kept between runs (specbound.decoding.acceptance): what is written,
what is read back, and what a bad file does."""
import json

import numpy as np
import pytest
from helpers import chain_models

from specbound.decoding import acceptance as memory
from specbound.decoding import batch as batch_module
from specbound.decoding.batch import speculative_decode_batch
from specbound.decoding.engine import speculative_decode
from specbound.decoding.sampling import SamplingConfig
from specbound.models.base import ModelInfo


@pytest.fixture
def named_pair(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path))
    target, draft = chain_models(3, 6, concentration=0.3, noise=1.0, draft_seed=4)
    target.info = ModelInfo(backend="chain", identity="t" * 8)
    draft.info = ModelInfo(backend="chain", identity="d" * 8)
    return target, draft


def _entry(target, draft, sampling=SamplingConfig(0.0), verification="token"):
    return memory.read_acceptance(memory.acceptance_key(target, draft, sampling, verification))


def test_a_chain_run_adds_its_per_depth_counts_the_older_ones_forgotten_by_half(named_pair):
    target, draft = named_pair
    first = speculative_decode(target, draft, [0, 1], 60, gamma=4, temperature=0.0)
    m = first.metrics
    assert sum(m.position_reached) > 20 and 0 < sum(m.position_accepted) < sum(m.position_reached)
    shown = _entry(target, draft)
    assert shown.reached == tuple(float(x) for x in m.position_reached)
    assert shown.accepted == tuple(float(x) for x in m.position_accepted)
    second = speculative_decode(target, draft, [2, 3], 60, gamma=2, temperature=0.0).metrics
    after = _entry(target, draft)
    depth = len(m.position_reached)
    expect = np.asarray(m.position_reached, dtype=float) * memory.FORGET
    expect[:len(second.position_reached)] += second.position_reached
    assert len(after.reached) == depth and after.reached == pytest.approx(tuple(expect))
    # the estimate per depth: (accepted + s·ā) / (reached + s), ā under Beta(1, 1) over all depths
    alpha = after.per_depth(6)
    pooled = (sum(after.accepted) + 1) / (sum(after.reached) + 2)
    assert alpha[0] == pytest.approx((after.accepted[0] + 2 * pooled) / (after.reached[0] + 2))
    assert alpha[5] == pytest.approx(pooled)                       # a depth never drafted: ā


def test_only_lossless_chain_runs_of_named_models_are_remembered_each_under_its_own_law(named_pair):
    target, draft = named_pair
    speculative_decode(target, draft, [0, 1], 30, tree=4, temperature=0.0)
    speculative_decode(target, draft, [0, 1], 30, gamma=3, relaxation="opt:0.1", temperature=1.0, seed=0)
    assert not memory.acceptance_file().exists()
    sampled = SamplingConfig(1.0, top_k=3)
    speculative_decode(target, draft, [0, 1], 30, gamma=3, temperature=1.0, top_k=3, seed=0)
    assert _entry(target, draft, sampled) is not None
    assert _entry(target, draft) is None and _entry(target, draft, sampled, "block") is None
    anonymous_target, anonymous_draft = chain_models(3, 6, concentration=0.3, noise=0.4, draft_seed=4)
    assert memory.acceptance_key(anonymous_target, anonymous_draft, sampled) is None


def test_a_batch_prices_its_start_at_the_remembered_acceptance_and_adds_its_own(named_pair, monkeypatch):
    target, draft = named_pair
    speculative_decode(target, draft, [0, 1], 40, gamma=4, temperature=0.0)
    remembered = _entry(target, draft)
    seen = {}

    class Spy(batch_module.BatchDraftLength):
        def __init__(self, *args, **kwargs):
            seen["shown"] = kwargs.get("shown")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(batch_module, "BatchDraftLength", Spy)
    # priced as rows sharing passes: the policy whose start gate reads the memory (rows read in turn size
    # each request's chain alone, with no start gate)
    monkeypatch.setattr(type(target), "rows_share_passes", True)
    out = speculative_decode_batch(target, draft, [[0, 1], [2, 3, 4]], 30, gamma="auto", temperature=0.0)
    assert seen["shown"] == pytest.approx(remembered.per_depth(8))
    after = _entry(target, draft)
    drafted = np.zeros(len(after.reached))
    for r in out.results:
        drafted[:len(r.metrics.position_reached)] += r.metrics.position_reached
    old = np.pad(np.asarray(remembered.reached), (0, len(after.reached) - len(remembered.reached)))
    assert after.reached == pytest.approx(tuple(drafted + memory.FORGET * old))


@pytest.mark.parametrize("content, problem", [
    ("not json", "unreadable"),
    (json.dumps({"version": 99, "entries": {}}), "not a version-1"),
])
def test_a_bad_memory_file_is_ignored_with_a_warning_and_rewritten(named_pair, content, problem):
    target, draft = named_pair
    path = memory.acceptance_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    key = memory.acceptance_key(target, draft, SamplingConfig(0.0))
    with pytest.warns(UserWarning, match=problem):
        assert memory.read_acceptance(key) is None
    with pytest.warns(UserWarning, match=problem):
        speculative_decode(target, draft, [0, 1], 20, gamma=2, temperature=0.0)
    assert memory.read_acceptance(key) is not None                 # repaired on disk


@pytest.mark.parametrize("entry, problem", [
    ({"accepted": [3, 2], "reached": [2, 2]}, "more accepted"),
    ({"accepted": [1, 1], "reached": [2, 3]}, "deeper depth"),
    ({"accepted": [-1], "reached": [2]}, "finite counts"),
    ({"accepted": [1], "reached": [2, 1]}, "differ in length"),
    ({"accepted": [], "reached": []}, "list of 1 to"),
    ("0.9", "not an object"),
])
def test_a_bad_entry_is_dropped_with_a_warning_and_the_others_kept(tmp_path, entry, problem):
    path = tmp_path / "acceptance.json"
    good = {"accepted": [8, 3], "reached": [10, 8]}
    path.write_text(json.dumps({"version": 1, "entries": {"bad": entry, "good": good}}))
    with pytest.warns(UserWarning, match=problem):
        assert memory.read_acceptance("bad", path) is None
    with pytest.warns(UserWarning, match=problem):
        assert memory.read_acceptance("good", path) == memory.ShownAcceptance((8.0, 3.0), (10.0, 8.0))
