"""One record of a moments estimate (theory.bounds.MomentEstimate), used by measure, advise and the
Pankratov study; results written before it existed still load."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from specbound.errors import SpecboundError
from specbound.experiments.pankratov import MomentRow, PankratovResult
from specbound.measure.moments import aggregate_moments
from specbound.measure.records import from_jsonable, to_jsonable
from specbound.theory.bounds import MomentEstimate, estimate_moments, pool_moments

ROOT = Path(__file__).resolve().parents[1]


def test_pooled_moments_carry_per_position_and_per_prompt_errors():
    rng = np.random.default_rng(0)
    H = [rng.random(n) for n in (5, 0, 7, 3)]                     # one prompt produced nothing
    m2 = [h * h + rng.random(h.size) for h in H]
    est = aggregate_moments(H, m2)
    flat_H, flat_m2 = np.concatenate(H), np.concatenate(m2)
    assert isinstance(est, MomentEstimate) and est.n == 15 and est.n_prompts == 3
    assert est.mu == pytest.approx(flat_H.mean()) and est.mu2 == pytest.approx(flat_m2.mean())
    assert est.se_mu == pytest.approx(flat_H.std(ddof=1) / math.sqrt(15))
    means = [h.mean() for h in H if h.size]
    assert est.se_mu_prompt == pytest.approx(np.std(means, ddof=1) / math.sqrt(3))
    assert est.frac_H_below_0p1 == pytest.approx(np.mean(flat_H < 0.1))
    # without groups: the per-context errors only, as estimate_moments gives them
    plain = pool_moments(flat_H, flat_m2)
    assert math.isnan(plain.se_mu_prompt) and plain.n_prompts == 0 and plain.se_mu == est.se_mu
    rows = rng.dirichlet(np.ones(6), size=9)
    a, b = estimate_moments(rows), pool_moments(-(rows * np.log(rows)).sum(-1), (rows * np.log(rows) ** 2).sum(-1))
    for name in ("mu", "mu2", "mean_H2", "var_surprisal", "se_mu", "se_mu2", "std_H"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-12), name
    with pytest.raises(SpecboundError, match="no generated positions"):
        aggregate_moments([[], []], [[], []])
    with pytest.raises(SpecboundError, match="groups must label"):
        pool_moments([1.0, 2.0], [1.0, 4.0], groups=[0])


def test_a_moment_row_holds_the_estimate_and_reads_its_older_flat_shape():
    est = pool_moments([0.5, 1.5], [0.5, 3.0], groups=[0, 1])
    row = MomentRow(model="m", set="humaneval", moments=est)
    data = json.loads(json.dumps(to_jsonable(row)))
    assert set(data) == {"model", "set", "moments"} and data["moments"]["mu"] == 1.0
    assert from_jsonable(MomentRow, data) == row
    flat = {"model": "m", "set": "humaneval", **{k: v for k, v in data["moments"].items() if k != "std_H"}}
    old = from_jsonable(MomentRow, flat)                             # the shape before the one record
    assert old.moments.mu == 1.0 and old.moments.n_prompts == 2 and math.isnan(old.moments.std_H)


def test_the_published_pankratov_results_still_load():
    """docs/results/reproduce-pankratov-20261202/results.json predates the one record (`--augment` reads it
    back)."""
    path = ROOT / "docs/results/reproduce-pankratov-20261202/results.json"
    data = json.loads(path.read_text())
    result = from_jsonable(PankratovResult, data, str(path))
    rows = result.llm.table
    assert len(rows) == len(data["llm"]["table"]) and all(isinstance(r.moments, MomentEstimate) for r in rows)
    for row, raw in zip(rows, data["llm"]["table"]):
        assert (row.model, row.set) == (raw["model"], raw["set"])
        assert row.moments.mu == pytest.approx(raw.get("mu", raw.get("moments", {}).get("mu")))
    analysis = result.llm.analyses[0]
    assert isinstance(analysis.moments, MomentEstimate) and analysis.moments.n > 0
