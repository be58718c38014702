"""The one sizing rule for chains and trees (decoding/policy.py) and the costs behind it
(decoding/costs.py): calibration learns, the E/T rule picks what a brute force picks, costs that a
run contradicts are corrected online and dropped from the cache, a bad cost file is repaired, and
auto-sized drafting stays lossless."""
import json
import time
import warnings

import numpy as np
import pytest
import torch

from helpers import DelegatingModel, chain_models, chi_square_pvalue, encode, processed_chain
from specbound.decoding import ChainDrafter, DynamicTreeDrafter, SamplingConfig, Speculator, speculative_decode
from specbound.decoding.costs import (
    CACHE_VERSION, CostMeasurement, CostModel, cost_key, costs_file, load_or_measure_costs, read_cost_cache,
)
from specbound.decoding.engine import make_generator
from specbound.decoding.policy import AcceptanceCalibration, DraftBudget
from specbound.models import ChainModel
from specbound.models.base import ModelInfo
from specbound.theory import MarkovChain
from specbound.theory.speedup import CostProfile


def _measurement(target_seconds, draft_seconds=(1e-3,) * 7, source="measured", key=None):
    ks = (1, 2, 4, 8, 16, 32, 64)
    return CostMeasurement(CostProfile(ks, tuple(target_seconds)), CostProfile(ks, tuple(draft_seconds)),
                           [0.0] * 7, [0.0] * 7, source=source, key=key)


FLAT = (1.0, 1.01, 1.02, 1.04, 1.08, 1.2, 1.5)
STEEP = (1.0, 2.7, 4.0, 7.0, 12.0, 20.0, 40.0)       # a busy-CPU calibration: t(2)/t(1) = 2.7


def test_calibration_learns_a_miscalibrated_draft():
    cal = AcceptanceCalibration()
    rng = np.random.default_rng(0)
    q = rng.uniform(0, 1, 4000)
    cal.observe(q, q ** 2)                          # the draft is over-confident: acceptance = q²
    for x in (0.15, 0.45, 0.75, 0.97):
        assert abs(float(cal(x)) - x ** 2) < 0.06, (x, float(cal(x)))
    assert abs(float(AcceptanceCalibration()(0.45)) - 0.45) < 1e-12      # prior: a calibrated draft


def test_best_prefix_matches_brute_force():
    budget = DraftBudget(CostModel(_measurement([0.3, 0.33, 0.36, 0.45, 0.6, 0.9, 1.4], [0.03] * 7)))
    rng = np.random.default_rng(1)
    for _ in range(50):
        values = np.sort(rng.uniform(0, 1, 20))[::-1].cumprod().tolist()
        spent = float(rng.uniform(0, 0.2))
        rates = [(1 + sum(values[:n])) / (spent + budget.costs.target(1 + n)) for n in range(21)]
        assert budget.best_prefix(values, spent, pending=1) == int(np.argmax(rates))


class SleepyModel(DelegatingModel):
    """A model whose every read of k tokens takes ``curve(k)`` seconds (a stand-in for a real cost curve)."""

    def __init__(self, inner, curve):
        super().__init__(inner, inner.name)
        self.curve = curve

    def forward(self, tokens, keep_logits=None):
        time.sleep(self.curve(tokens.shape[1]))
        return self.inner.forward(tokens, keep_logits)

    def forward_tree(self, tokens, parents):
        time.sleep(self.curve(tokens.shape[1]))
        return self.inner.forward_tree(tokens, parents)

    def keep_path(self, base_length, path):
        self.inner.keep_path(base_length, path)


def _steep(k):
    return 2e-3 * float(np.interp(k, (1, 2, 4, 8, 16, 32, 64), STEEP))


def _flat(k):
    return 2e-3 * float(np.interp(k, (1, 2, 4, 8, 16, 32, 64), FLAT))


def test_good_draft_and_flat_costs_draft_long_bad_draft_and_steep_costs_go_plain():
    tm, dm = chain_models(3, 6, concentration=0.3, noise=0.05, draft_seed=4)
    res = Speculator(tm, ChainDrafter(dm, SamplingConfig(0.0), DraftBudget(CostModel(_measurement(FLAT)))),
                     generator=make_generator(0)).run([1], 200)
    assert res.metrics.plain_steps == 0 and res.metrics.tau > 4
    # a useless draft (uniform) and a target whose reads really cost STEEP: plain steps, except probes
    uniform = SleepyModel(ChainModel(MarkovChain(np.full(6, 1 / 6), np.full((6, 6), 1 / 6))), lambda k: 1e-3)
    steep_target = SleepyModel(tm, _steep)
    budget = DraftBudget(CostModel(_measurement([_steep(k) for k in (1, 2, 4, 8, 16, 32, 64)], [1e-3] * 7)))
    res = Speculator(steep_target, ChainDrafter(uniform, SamplingConfig(0.0), budget),
                     generator=make_generator(0)).run([1], 80)
    m = res.metrics
    assert m.plain_steps >= 0.85 * m.target_calls and m.plain_steps < m.target_calls   # probes, backing off


def test_a_busy_calibration_cannot_keep_decoding_plain():
    # the cached profile says k=2 costs 2.7x k=1 (taken on a busy CPU); the run itself sees flat costs.
    # Online correction must take over at the first probe.
    tm, dm = chain_models(3, 6, concentration=0.3, noise=0.05, draft_seed=4)
    budget = DraftBudget(CostModel(_measurement([_steep(k) for k in (1, 2, 4, 8, 16, 32, 64)], [2e-4] * 7)))
    res = Speculator(SleepyModel(tm, _flat), ChainDrafter(SleepyModel(dm, lambda k: 2e-4), SamplingConfig(0.0), budget),
                     generator=make_generator(0)).run([1], 300)
    assert res.metrics.plain_steps <= budget.explore_every, res.metrics.plain_steps   # recovers at the first probe
    assert res.metrics.tau > 3


def test_stale_cached_profile_is_dropped_and_bad_cost_files_are_repaired(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path))
    target, draft = chain_models(3, 6, concentration=0.3, noise=0.2, draft_seed=4)
    target.info = ModelInfo(backend="chain", identity="t" * 8)
    draft.info = ModelInfo(backend="chain", identity="d" * 8)
    target.prefill([1, 2])
    draft.prefill([1, 2])
    key = cost_key(target, draft)
    first = load_or_measure_costs(target, draft, repeats=1)
    assert first.source == "measured" and key in read_cost_cache()
    again = load_or_measure_costs(target, draft, repeats=1)
    assert again.source == "cache" and again.target.seconds == first.target.seconds
    # the run sees 3x the cached t(k): decoding follows the run, and at its end the cached entry is
    # dropped, so the next run measures again (a run's view of a few sizes at one moment, stored and
    # corrected run after run, left a kquant t(1) at 2x what fresh calibrations measure)
    model = CostModel(again)
    with pytest.warns(UserWarning, match="disagrees"):
        for k in (1, 2, 4, 8, 1):
            model.observe_target(k, 3 * float(again.target(k)))
    assert model.target(8) == pytest.approx(3 * float(again.target(8)), rel=1e-9)   # the run wins where it looked
    model.drop_if_stale()
    assert key not in read_cost_cache()
    assert load_or_measure_costs(target, draft, repeats=1).source == "measured"
    calm = CostModel(load_or_measure_costs(target, draft, repeats=1))           # a run that agrees keeps it
    calm.drop_if_stale()
    assert key in read_cost_cache()
    # malformed cost files: every case warns (naming the file), is ignored, and is measured again
    path = costs_file()
    entry = first.as_entry()
    bad_files = [
        "[1, 2, 3]", "{not json", json.dumps({"version": CACHE_VERSION, "entries": {key: "fast"}}),
        json.dumps({"version": CACHE_VERSION, "entries": {key: {**entry, "target": {"ks": [1, 2], "seconds": [0.0, float("nan")]}}}}),
        json.dumps({"version": CACHE_VERSION, "entries": {key: {**entry, "target": {"ks": [2, 1], "seconds": [1.0, 1.0]}}}}),
        json.dumps({"version": CACHE_VERSION - 1, "entries": {}}),
    ]
    for text in bad_files:
        path.write_text(text)
        with pytest.warns(UserWarning, match=str(path.name)):
            assert read_cost_cache() == {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fresh = load_or_measure_costs(target, draft, repeats=1)
        assert fresh.source == "measured" and key in read_cost_cache()      # repaired on disk


def test_models_without_identity_never_write_the_cost_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path))
    target, draft = chain_models(3, 6, concentration=0.3, noise=0.2, draft_seed=4)
    target.prefill([1])
    draft.prefill([1])
    assert cost_key(target, draft) is None
    load_or_measure_costs(target, draft, repeats=1)
    assert not costs_file().exists()


@pytest.mark.montecarlo
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_auto_sized_drafting_is_lossless(kind):
    tm, dm = chain_models(5, 4, concentration=1.0, noise=0.5, draft_seed=6)
    ar = speculative_decode(tm, dm, [0, 2], 40, temperature=0.0, gamma=1)
    kwargs = dict(gamma="auto") if kind == "chain" else dict(tree="auto")
    assert speculative_decode(tm, dm, [0, 2], 40, temperature=0.0, **kwargs).tokens == ar.tokens
    config = SamplingConfig(1.0, top_k=3)
    law = processed_chain(tm.chain, config).sequence_law(0, 3)
    flat = CostModel(_measurement(FLAT, [0.05] * 7))
    samples = np.empty((3000, 3), dtype=np.int64)
    for i in range(3000):
        budget = DraftBudget(flat, explore_every=2)
        drafter = ChainDrafter(dm, config, budget) if kind == "chain" else \
            DynamicTreeDrafter(dm, config, 8, budget=budget)
        samples[i] = Speculator(tm, drafter, config, generator=make_generator(i)).run([0], 3).tokens
    # 3000 runs over 64 cells: ≈ 47 expected per cell; fixed seeds
    assert chi_square_pvalue(encode(samples, 4), law) > 1e-3
