"""`specbound analyze` helpers on tiny random transformers and `reproduce pankratov --quick --skip-llm`
(Pankratov & Alistarh 2026). Only what theory guarantees is asserted: T*(P) maximises Σ p(v) over
prefix-closed trees of ≤ P nodes, its values are nested (non-decreasing, concave in P), the oracle's
accepted length has mean E[X|T], and the i.i.d. slope of E[X*] vs ln P is 1/μ. (The renewal bound is
NOT asserted on the tiny model: its contexts are not i.i.d.)"""
import json
import math
import time

import numpy as np
import pytest
import torch

from specbound.experiments import analyze as az
from specbound.experiments import analyze_report, report
from specbound.measure import drafter_values, moments, oracle
from specbound.measure.llm import PromptContext
from specbound.cli import main
from specbound.decoding import DynamicTreeDrafter, SamplingConfig
from specbound.decoding.sampling import logits_to_probs
from specbound.errors import SpecboundError
from specbound.models.hf import HFModel
from specbound.theory import estimate_moments, optimal_tree, tree_value


# The tiny pair is a float32 transformer: its logits (and, through logits_to_probs, its softmax) are float32,
# widened to float64 only afterwards, and the values compared below read the target in different ways (the
# oracle's batched reads, the drafter's tree read, a fresh full forward). Two values equal in exact arithmetic
# therefore differ by a few float32 ulps OF THE VALUE (on an Intel Xeon: 0.12176948 vs 0.12176945 at P = 1,
# 2.6e-7 relative, ~2 float32 epsilons), so "never above" is checked at 8 float32 epsilons relative to the
# value, not at a float64 tolerance such as 1e-9.
F32_RTOL = 8 * float(np.finfo(np.float32).eps)


def _at_most(value, bound) -> bool:
    """value ≤ bound up to float32 rounding of values computed from float32 laws (F32_RTOL)."""
    return bool(np.all(np.asarray(value) <= np.asarray(bound) + F32_RTOL * np.abs(np.asarray(bound))))


def _direct_law(model: HFModel, context, config: SamplingConfig) -> np.ndarray:
    """Target law after ``context`` from a fresh, cache-free full forward."""
    with torch.inference_mode():
        logits = model.model(input_ids=torch.tensor([list(context)])).logits[0, -1].double()
    return logits_to_probs(logits, config).numpy()


# ------------------------------------------------------------------ quick reproduction without models
def test_reproduce_pankratov_quick_skip_llm(tmp_path):
    t0 = time.perf_counter()
    code = main(["reproduce", "pankratov", "--quick", "--skip-llm", "--no-progress", "--out", str(tmp_path)])
    assert time.perf_counter() - t0 < 30
    assert code == 0
    for name in ("results.json", "report.md", "report.html", "synthetic_slopes.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["llm"] is None and "skip-llm" in result["llm_note"]
    cases = result["synthetic"]["cases"]
    assert len(cases) >= 3
    for case in cases:
        assert abs(case["slope"] * case["mu"] - 1) <= 0.05, case["name"]
        assert case["renewal_holds"] and case["published_holds_P_ge_3"], case["name"]
    # the T3 reference values (docs/paper-notes.md, Pankratov §5): p = (0.6, 0.25, 0.1, 0.05), uniform V = 4
    t3a = next(c for c in cases if c["name"].startswith("T3a"))
    assert t3a["checkpoints"]["16"] == pytest.approx(2.540, abs=1e-3)
    assert t3a["checkpoints"]["1024"] == pytest.approx(6.501, abs=1e-3)
    t3d = next(c for c in cases if c["name"].startswith("T3d"))
    assert t3d["checkpoints"]["20"] == pytest.approx(2.0) and t3d["checkpoints"]["84"] == pytest.approx(3.0)
    report = (tmp_path / "report.md").read_text()
    assert "LLM parts skipped" in report and "synthetic_slopes.png" in report
    assert '<img src="synthetic_slopes.png"' in (tmp_path / "report.html").read_text()


# ------------------------------------------------------------------ (a) moments
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_moments_equal_direct_computation(backend_pair, temperature):
    """H and m2 (read on the cached prompt after sampling) equal a fresh full forward's, on each backend."""
    target, _ = backend_pair
    prompt = [3, 17, 5, 9]
    sample = moments.sample_with_moments(target, prompt, 12, temperature, torch.Generator().manual_seed(0))
    assert len(sample.tokens) == len(sample.H) == len(sample.m2) == 12
    seq = prompt + sample.tokens
    with torch.inference_mode():
        logits = target.model(input_ids=torch.tensor([seq])).logits[0, len(prompt) - 1:-1].double()
    logp = torch.log_softmax(logits / temperature, dim=-1).numpy()
    p = np.exp(logp)
    H = -(p * logp).sum(-1)
    m2 = (p * logp ** 2).sum(-1)
    np.testing.assert_allclose(sample.H, H, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sample.m2, m2, rtol=1e-4, atol=1e-5)
    # pooled estimate == estimate_moments on the stacked rows (same formulas), and E[H²] ≤ μ₂ (Jensen)
    other = moments.sample_with_moments(target, [7, 7], 5, temperature, torch.Generator().manual_seed(1))
    agg = moments.aggregate_moments([sample.H, other.H], [sample.m2, other.m2])
    with torch.inference_mode():
        seq2 = [7, 7] + other.tokens
        logits2 = target.model(input_ids=torch.tensor([seq2])).logits[0, 1:-1].double()
    ref = estimate_moments(torch.cat([logits, logits2]).numpy(), temperature=temperature, from_logits=True)
    for key in ("mu", "mu2", "mean_H2", "var_surprisal", "se_mu", "se_mu2"):
        assert getattr(agg, key) == pytest.approx(getattr(ref, key), rel=1e-4, abs=1e-6), key
    assert agg.n == ref.n == 17 and agg.n_prompts == 2
    assert agg.mean_H2 <= agg.mu2


def test_several_texts_per_prompt_are_one_cluster(pair):
    """texts_per_prompt = 2: every prompt sampled twice from streams of its own (the first text is the one a
    single-text run draws), each sample labelled with its prompt, the moments' SE taken across prompts."""
    target, _ = pair
    prompts = [[1, 2, 3], [5, 6], [9, 4, 4]]
    one = moments.measure_moments(target, prompts, 6, 1.0, seed=3)
    two = moments.measure_moments(target, prompts, 6, 1.0, seed=3, texts_per_prompt=2)
    assert [s.prompt_index for s in two.samples] == [0, 0, 1, 1, 2, 2]
    assert [s.tokens for s in two.samples[::2]] == [s.tokens for s in one.samples]
    assert all(a.tokens != b.tokens for a, b in zip(two.samples[::2], two.samples[1::2]))
    assert two.estimate.n_prompts == 3 and one.estimate.n_prompts == 3
    with pytest.raises(SpecboundError, match="texts_per_prompt"):
        moments.measure_moments(target, prompts, 6, 1.0, texts_per_prompt=0)
    res = oracle.oracle_values(target, two.samples, (1, 4), 12, 1.0, 4)
    assert [p.cluster for p in res.positions] == [two.samples[p.sample].prompt_index for p in res.positions]
    assert res.n_clusters == 3 and res.n_samples == 6


# ------------------------------------------------------------------ (b) oracle trees
@pytest.mark.parametrize("width", [1, 4, 16])
def test_batched_oracle_tree_equals_theory_optimal_tree(pair, width):
    target, _ = pair
    config = SamplingConfig(1.0)
    context = [3, 17, 5, 9, 21]
    ref = optimal_tree(lambda path: _direct_law(target, context + list(path), config), 24)
    target.reset()
    target.forward(torch.tensor([context[:-1]]))
    tree, info = oracle.oracle_tree_at(target, context, 24, width=width, config=config)
    assert target.cache_length == len(context) - 1            # cache restored
    assert tree.nodes == ref.nodes
    assert tree.value == pytest.approx(ref.value, rel=1e-5)
    if width > 1:
        assert info.reads < len(tree.nodes)               # batching saved target calls
    # nested optimal trees: running sums are E[X|T*(n)] for every n ≤ P
    run = np.cumsum(tree.path_probs)
    for n in (1, 3, 10):
        assert run[n - 1] == pytest.approx(
            optimal_tree(lambda path: _direct_law(target, context + list(path), config), n).value, rel=1e-5)


def test_pruned_and_guessed_prefetch_read_fewer_laws_and_keep_the_tree(pair):
    """TargetLaws with the capacity (prefetch pruned) and a guessed chain (the target's greedy path, or
    a path off the tree) builds the same T*(P) as unpruned reads; pruning reads fewer laws, and the
    greedy guess fewer target calls."""
    from specbound.decoding import TargetLaws

    target, _ = pair
    config = SamplingConfig(1.0)
    context = [3, 17, 5, 9, 21]
    greedy, node = [], ()
    for _ in range(8):
        node = node + (int(np.argmax(_direct_law(target, context + list(node), config))),)
    greedy = list(node)

    def build(**kw):
        target.reset()
        target.forward(torch.tensor([context[:-1]]))
        laws = TargetLaws(target, context, config, width=8, **kw)
        tree = optimal_tree(laws, 24)
        laws.restore()
        return tree, laws

    ref, full = build()
    for kw in ({"capacity": 24}, {"capacity": 24, "guess": greedy}, {"capacity": 24, "guess": [0, 1, 2, 3]},
               {"guess": greedy, "max_depth": 3}):
        tree, laws = build(**kw)
        assert tree.nodes[: len(ref.nodes)] == ref.nodes or "max_depth" in kw, kw
        assert tree.value == pytest.approx(ref.value, rel=1e-6) or "max_depth" in kw, kw
    _, pruned = build(capacity=24)
    assert len(pruned.laws) < len(full.laws)
    _, guessed = build(capacity=24, guess=greedy)
    assert guessed.reads <= pruned.reads
    with pytest.raises(SpecboundError, match="capacity"):
        build(capacity=0)


def test_oracle_value_dominates_real_deterministic_trees(pair):
    """T*(P) maximises Σ p_target(v) over prefix-closed trees with ≤ P nodes (§2): the dynamic drafter's
    tree and the greedy chain of the draft can only be worse under the target's law."""
    target, draft = pair
    config = SamplingConfig(1.0)
    context = [11, 2, 30, 4]

    def law(path):
        return _direct_law(target, context + list(path), config)

    for P in (1, 3, 8, 20):
        target.reset()
        target.forward(torch.tensor([context[:-1]]))
        tree, _ = oracle.oracle_tree_at(target, context, P, config=config)
        drafter = DynamicTreeDrafter(draft, config, P, width=3)
        drafter.start(target, context)
        drafted = drafter.propose(context, P, torch.Generator())
        paths = []
        for tok, parent in zip(drafted.tokens.tolist(), drafted.parents.tolist()):
            paths.append((tok,) if parent < 0 else paths[parent] + (tok,))
        assert len(paths) <= P
        assert _at_most(tree_value(paths, law), tree.value)
        chain, node = [], ()
        for _ in range(P):                                       # the target's own greedy chain
            node = node + (int(np.argmax(law(node))),)
            chain.append(node)
        assert _at_most(tree_value(chain, law), tree.value)


def test_oracle_values_are_nested_and_concave(pair):
    target, _ = pair
    cfg = az.AnalyzeConfig(n_prompts=2, tokens=6, capacities=(1, 2, 4, 8, 16), oracle_positions=4, oracle_width=4)
    mom = moments.measure_moments(target, [[1, 2, 3], [5, 6]], cfg.tokens, cfg.temperature)
    res = oracle.oracle_values(target, mom.samples, cfg.capacities, cfg.oracle_positions, cfg.temperature,
                               cfg.oracle_width)
    vals = np.asarray(res.per_position)
    assert vals.shape == (4, 5)
    assert np.all(np.diff(vals, axis=1) >= -1e-12)             # more capacity never hurts
    gains = np.diff(np.concatenate([np.zeros((4, 1)), vals], axis=1), axis=1) / np.diff([0, 1, 2, 4, 8, 16])
    assert np.all(np.diff(gains, axis=1) <= 1e-9)                # average gain per node decreases (concave)
    assert np.all(vals <= np.asarray(cfg.capacities) + 1e-12)
    for pos, row in zip(res.positions, vals):                     # E[X|T*(1)] = largest root probability
        assert row[0] == pytest.approx(pos.root_top, rel=1e-9)
        # the oracle's root law is the law whose entropy (a) measured at that generated position
        assert pos.root_entropy == pytest.approx(pos.entropy_at_position, rel=1e-4)


# ------------------------------------------------------------------ the whole per-set analysis
def test_analyze_set_on_tiny_models(pair, tmp_path):
    target, draft = pair
    cfg = az.AnalyzeConfig(n_prompts=2, tokens=8, capacities=(1, 4, 8), oracle_positions=3, oracle_width=4,
                           oracle_sd_capacities=(1, 8), oracle_sd_tokens=40, drafter_prompts=1, drafter_tokens=12,
                           cost_repeats=1)
    res = az.analyze_set(target, draft, "tiny", cfg, prompt_ids=[[1, 2, 3], [4, 5]], progress=False,
                         log=lambda *a: None)
    assert set(res.bounds) >= {"capacity", "published", "renewal", "threshold", "asymptotic"}
    assert res.moments.n == 16
    for P, sd in res.oracle_sd.by_capacity.items():
        # accepted length minus E[X|T] of the drafted tree: martingale differences with mean 0
        assert abs(sd.diff_mean) <= 4 * sd.diff_se + 1e-9, (P, sd)
    assert set(res.drafters) == {"chain", "dynamic"}
    for d in res.drafters.values():
        for r in d.by_capacity.values():
            assert r.tau >= 1.0 and r.draft_seconds_per_round > 0
    rows = res.speedups.rows
    assert [r.P for r in rows] == [1, 4, 8]
    for i, r in enumerate(rows):
        assert r.const["oracle"] == pytest.approx(res.oracle.mean[i] + 1)
        assert r.const["renewal"] == pytest.approx(res.bounds["renewal"][i] + 1)
        assert r.wall["dynamic"] > 0 and math.isfinite(r.wall["chain"])
    paths = analyze_report.write_report(res, tmp_path)
    for path in paths.values():
        assert path.stat().st_size > 0
    html = (tmp_path / "report.html").read_text()
    assert '<img src="expected_accepted.png"' in html and "<table>" in html
    assert json.loads((tmp_path / "analyze.json").read_text())["set"] == "tiny"


def test_markdown_to_html_subset():
    md = "# T\n\nsome `code` text\n\n| a | b |\n|---|---:|\n| 1 | 2 |\n\n- x\n- y\n\n![cap](f.png)\n"
    html = report.markdown_to_html(md)
    assert "<h1>T</h1>" in html and "<code>code</code>" in html
    assert "<th>a</th>" in html and "<td>2</td>" in html and "<li>x</li>" in html
    assert '<img src="f.png"' in html


@pytest.mark.montecarlo
def test_exact_drafter_values_match_their_definitions(pair):
    """Dynamic tree: E[X|T_dyn(1)] = target prob of the draft's arg-max, and ≤ E[X|T*(P)] for every P.
    Chain: averaged over drafted tokens, the conditional expectation at γ = 1 is Σ_a min(target, draft)."""
    target, draft = pair
    config = SamplingConfig(1.0)
    context = [5, 40, 2, 19]
    p = _direct_law(target, context, config)
    q = _direct_law(draft, context, config)
    t_ctx, d_ctx = PromptContext(target), PromptContext(draft)
    t_ctx.set(context)
    d_ctx.set(context)
    optimal, _ = oracle.oracle_tree_at(target, context, 16, config=config)
    oracle_run = np.cumsum(optimal.path_probs)
    chain_first = []
    for i in range(300):
        vals = drafter_values.drafter_values_at(target, draft, context, 16, config, torch.Generator().manual_seed(i))
        assert target.cache_length == draft.cache_length == len(context) - 1      # caches restored
        chain_first.append(vals["chain"].running[0])
        if i == 0:
            dyn = np.asarray(vals["dynamic"].running)
            assert dyn[0] == pytest.approx(p[int(np.argmax(q))], rel=1e-5)
            assert _at_most(dyn, oracle_run[: dyn.size])
            assert np.all(np.diff(vals["chain"].running) >= 0)
    overlap = np.minimum(p, q).sum()
    se = np.std(chain_first, ddof=1) / math.sqrt(len(chain_first))
    assert abs(np.mean(chain_first) - overlap) <= 4 * se + 1e-9


# ------------------------------------------------------------------ oracle precision and slope, claims
def _positions(samples):
    from specbound.measure.oracle import OraclePosition

    return [OraclePosition(reads=1, laws=1, seconds=0.0, root_entropy=0.0, root_top=1.0, depth=1, sample=s, position=k)
            for k, s in enumerate(samples)]


def test_oracle_values_slope_and_sample_clustered_se():
    """Values a_i + b_i ln P give the slope mean(b_i) exactly (fitted over P ≥ 4 only); the SE by sample
    treats the positions of one text as one unit, so two identical positions per text do not halve it."""
    from specbound.measure.oracle import OracleValues

    caps = [1, 2, 4, 8, 16, 64]
    b = np.array([0.5, 0.7, 1.1, 0.9])
    a = np.array([0.3, 0.1, 0.0, 0.2])
    rows = [(ai + bi * np.log(caps)).tolist() for ai, bi in zip(a, b)]
    rows[0][0] = 99.0                                    # P = 1 is not in the fit
    ov = OracleValues(caps, rows, _positions([0, 1, 2, 3]), 4)
    assert ov.slope_capacities == [4, 8, 16, 64]
    assert ov.slope == pytest.approx(b.mean(), rel=1e-12)
    assert ov.slope_se == pytest.approx(b.std(ddof=1) / 2, rel=1e-12)          # 4 texts, one position each
    doubled = OracleValues(caps, rows + rows, _positions([0, 1, 2, 3, 0, 1, 2, 3]), 4)
    assert doubled.se[2] < ov.se[2]                       # naive SE shrinks with copies ...
    assert doubled.se_by_sample[2] == pytest.approx(ov.se_by_sample[2], rel=1e-12)   # ... the honest one does not
    assert doubled.n_samples == 4 and doubled.n_positions == 8
    # two texts of each prompt (samples 4..7 continue prompts 0..3): still four units, not eight
    texts = _positions([0, 1, 2, 3, 4, 5, 6, 7])
    for p in texts:
        p.cluster = p.sample % 4
    by_prompt = OracleValues(caps, rows + rows, texts, 4)
    assert by_prompt.n_samples == 8 and by_prompt.n_clusters == 4
    assert by_prompt.se_by_sample[2] == pytest.approx(ov.se_by_sample[2], rel=1e-12)
    assert OracleValues(caps, rows + rows, _positions(range(8)), 4).se_by_sample[2] < ov.se_by_sample[2]


def test_pankratov_claims_verdicts():
    from specbound.experiments import pankratov as pk
    from specbound.theory.bounds import MomentEstimate

    def est(mu, se):
        return MomentEstimate(mu=mu, mu2=2 * mu, mean_H2=mu, var_surprisal=mu, n=100, se_mu=se, se_mu2=se,
                              se_mu_prompt=se, se_mu2_prompt=2 * se, n_prompts=10)

    big = [pk.MomentRow("qwen2.5-coder-1.5b (target)", s, est(0.5, 0.02)) for s in pk.SETS]
    small = [pk.MomentRow("qwen2.5-coder-0.5b (draft, int8)", s, est(mu, 0.02))
             for s, mu in zip(pk.SETS, (0.8, 0.52, 0.2))]
    claims = pk.model_order_claims(big + small, "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    verdicts = {c.a.split("(")[1][:-1] + "/" + c.quantity: c.verdict for c in claims}
    assert verdicts["humaneval/μ"] == "larger model lower μ at 95%"
    assert verdicts["mtbench/μ"].startswith("not decided")
    assert verdicts["gsm8k/μ"].startswith("larger model HIGHER μ")
    x = pk.Interval(1.0, 0.1)
    assert (x.lo, x.hi) == pytest.approx((1.0 - 0.196, 1.0 + 0.196), abs=1e-3)


def test_pankratov_claims_on_tiny_analyses(pair):
    """claims() over two tiny analyses: one precision row, one slope row and one bound row per set, one
    ordered pair of sets; every verdict is one of the stated forms."""
    from specbound.experiments import pankratov as pk

    target, draft = pair
    cfg = az.AnalyzeConfig(n_prompts=3, tokens=8, capacities=(1, 4, 16), oracle_positions=6, drafter_positions=2,
                           oracle_width=4, oracle_sd_capacities=(), drafter_prompts=0, cost_repeats=1)
    analyses = [az.analyze_set(target, draft, name, cfg, prompt_ids=ids, progress=False, log=lambda *a: None)
                for name, ids in (("humaneval", [[1, 2, 3], [4, 5], [6]]), ("gsm8k", [[7, 8], [9], [3, 3]]))]
    assert analyses[0].drafter_exact.n_positions == 2 and analyses[0].oracle.n_positions == 6
    from specbound.experiments.analyze_report import per_p_table

    for a in analyses:                                  # the drafters' rows are oracle rows: T*(P) is never beaten
        rows = a.drafter_exact.oracle_indices
        assert rows == [0, 5]
        for r, values in zip(rows, a.drafter_exact.dynamic.per_position):
            assert all(_at_most(v, o) for v, o in zip(values, a.oracle.per_position[r]))
        table = per_p_table(a)
        assert "oracle E[X*] at the same 2 positions" in table
        # the chain's drafts also scored under block verification: one drafted token is one rule
        block, token = a.drafter_exact.chain_block, a.drafter_exact.chain
        assert "chain, block verification: exact E[X" in table and len(block.per_position) == 2
        assert [r[0] for r in block.per_position] == pytest.approx([r[0] for r in token.per_position], abs=1e-12)
        same = np.mean([a.oracle.per_position[r] for r in rows], axis=0)
        assert table.splitlines()[-1].rstrip(" |").endswith(f"| {same[-1]:.3f}")
    study = pk.LLMStudy(analyses=analyses, table=[pk.MomentRow(f"{target.name} (target)", a.set, a.moments)
                                                  for a in analyses])
    c = pk.claims(study)
    assert [o.set for o in c.oracle_precision] == ["humaneval", "gsm8k"] and c.oracle_precision[0].P == [4, 16]
    assert len(c.slopes) == 2 and len(c.set_order) == 2 and len(c.bounds) == 2
    for s in c.slopes:
        assert s.slope.lo <= s.slope.value <= s.slope.hi
        assert s.verdict.split(" ")[0] in ("slope", "consistent", "not")
    assert c.set_order[0].verdict.split(":")[0] in ("confirmed at 95%", "contradicted at 95%", "not decided")
    assert 0 <= c.decided <= c.total == 2 + 1 + 2
    from specbound.experiments.pankratov_report import claims_markdown
    from specbound.measure.stats import variance_split

    for o, a in zip(c.oracle_precision, analyses):        # the split is the measured one, per P
        j = a.oracle.capacities.index(16)
        col = [row[j] for row in a.oracle.per_position]
        b, w = variance_split(col, [p.unit for p in a.oracle.positions])
        assert (o.between_var[1], o.within_var[1]) == pytest.approx((b, w), nan_ok=True)
        if o.set_prompts and math.isfinite(b) and o.value[1] > 0:
            assert o.floor_relative_se[1] == pytest.approx(math.sqrt(b / o.set_prompts) / o.value[1])
    text = claims_markdown(c, 60.0, "tiny")
    assert "Where the error comes from" in text and "| humaneval | 16 |" in text
