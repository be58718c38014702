"""The experiments layer: options and --out refused before any work, partial results and --resume,
typed results through JSON and back (also the committed real-model results), Table 1 of Yin et al. on
a tiny pair, and the one stop-token finder."""
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from specbound.cli import main
from specbound.errors import SpecboundError
from specbound.experiments import analyze as az
from specbound.measure.journal import PartialResults
from specbound.experiments.report import check_output_dir, from_jsonable, to_jsonable

DOCS = Path(__file__).resolve().parents[1] / "docs" / "results"


def _tiny_config(**overrides):
    base = dict(n_prompts=2, tokens=6, capacities=(1, 4), oracle_positions=2, oracle_width=4, oracle_sd_capacities=(4,),
                oracle_sd_tokens=8, drafter_prompts=1, drafter_tokens=6, cost_repeats=1)
    base.update(overrides)
    return az.AnalyzeConfig(**base)


# ------------------------------------------------------------------ refused before any work
@pytest.mark.parametrize("argv", [
    ["reproduce", "pankratov", "--quick", "--skip-llm", "--no-progress", "--out", "/proc/x"],
    ["reproduce", "yin", "--quick", "--skip-llm", "--out", "/proc/x"],
    ["analyze", "--prompts", "builtin", "--quick", "--out", "/proc/x"],
])
def test_unwritable_out_fails_before_measuring(argv, capsys):
    t0 = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - t0 < 5                      # nothing was measured (analyze loads no model)
    err = capsys.readouterr().err
    assert "output directory '/proc/x' is not writable" in err and "--out" in err


def test_out_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SpecboundError, match="not writable"):
        check_output_dir(tmp_path / "file" / "sub")
    assert check_output_dir(tmp_path / "new" / "dir").is_dir()


@pytest.mark.parametrize("argv, message", [
    (["reproduce", "yin", "--samples", "-1"], "--samples must be >= 1"),
    (["reproduce", "yin", "--prompts", "0"], "--prompts must be >= 1"),
    (["reproduce", "yin", "--mc-runs", "1"], "--mc-runs must be >= 2"),
    (["reproduce", "yin", "--engine-runs", "-3"], "--engine-runs must be >= 0"),
    (["reproduce", "yin", "--llm-minutes", "-1"], "--llm-minutes must be a number >= 0"),
    (["reproduce", "yin", "--prompt-set", "nope"], "unknown --prompt-set 'nope'"),
    (["reproduce", "yin", "--eps", "0.1,x"], "--eps must be comma-separated numbers > 0"),
    (["reproduce", "yin", "--eps", "0.1,0"], "--eps must be distinct comma-separated numbers > 0"),
    (["reproduce", "pankratov", "--threads", "0"], "--threads must be >= 1"),
    (["analyze", "--prompts", "builtin", "--n-prompts", "0"], "--n-prompts must be >= 1"),
    (["analyze", "--prompts", "builtin", "--tokens", "-2"], "--tokens must be >= 1"),
    (["analyze", "--prompts", "builtin", "--texts-per-prompt", "0"], "--texts-per-prompt must be >= 1"),
    (["analyze", "--prompts", "builtin", "--oracle-positions", "-1"], "--oracle-positions must be >= 0"),
    (["analyze", "--prompts", "builtin", "--temperature", "0"], "temperature must be > 0"),
    (["analyze", "--prompts", "nope"], "unknown prompt set 'nope'"),
])
def test_bad_options_give_clear_errors_before_work(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    t0 = time.perf_counter()
    assert main(argv + ["--out", str(out)]) == 2
    assert time.perf_counter() - t0 < 5
    assert message in capsys.readouterr().err
    assert not out.exists()                                  # refused before the output directory was made


# ------------------------------------------------------------------ partial results
def test_journal_keeps_units_drops_bad_lines_and_refuses_other_settings(tmp_path):
    path = tmp_path / "partial.jsonl"
    j = PartialResults(path, {"a": 1})
    assert j.unit("x", list[int], lambda: [1, 2]) == [1, 2]
    j.put("y", {"v": 3.5})
    with open(path, "a") as fh:                               # a torn line and garbage, as after a crash
        fh.write('{"key": "z", "data"\n["not", "an", "entry"]\n')
    warnings = []
    j2 = PartialResults(path, {"a": 1}, resume=True, warn=warnings.append)
    assert set(j2.units) == {"x", "y"} and len(warnings) == 2
    assert all("dropped" in w for w in warnings)
    calls = []
    assert j2.unit("x", list[int], lambda: calls.append(1)) == [1, 2] and not calls   # reused, not measured
    # a unit that no longer decodes into its type is measured again
    assert j2.unit("y", list[int], lambda: [7]) == [7] and any("measuring it again" in w for w in warnings)
    # the file was rewritten without the bad lines, then appended to
    lines = path.read_text().splitlines()
    assert all(json.loads(line) for line in lines) and len(lines) == 4
    with pytest.raises(SpecboundError, match="other settings"):
        PartialResults(path, {"a": 2}, resume=True)
    path.write_text("garbage\n")
    with pytest.raises(SpecboundError, match="not a specbound partial-results file"):
        PartialResults(path, {"a": 1}, resume=True)
    fresh = PartialResults(path, {"a": 1})                    # without --resume: a new journal
    assert len(fresh) == 0 and json.loads(path.read_text())["fingerprint"] == {"a": 1}


def test_analyze_set_resumes_from_partial_results(pair, tmp_path, monkeypatch):
    target, draft = pair
    cfg = _tiny_config()
    prompts = [[1, 2, 3], [4, 5]]
    path = tmp_path / "partial.jsonl"
    first = az.analyze_set(target, draft, "tiny", cfg, prompt_ids=prompts, progress=False, log=lambda *a: None,
                           journal=PartialResults(path, {"cfg": to_jsonable(cfg)}))
    n_units = len(path.read_text().splitlines()) - 1
    assert n_units == 2 + 2 + 2 + 1 + 2 * 2        # moments, oracle, drafter values, oracle SD, 2 drafters x 2 P
    # interrupted run: the last unit's line is torn; resuming measures only that unit again
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    from specbound.measure import drafter_values, moments, oracle

    def forbidden(*args, **kwargs):
        raise AssertionError("a finished unit was measured again")

    monkeypatch.setattr(moments, "sample_with_moments", forbidden)
    monkeypatch.setattr(oracle, "oracle_tree_at", forbidden)
    monkeypatch.setattr(drafter_values, "drafter_values_at", forbidden)
    journal = PartialResults(path, {"cfg": to_jsonable(cfg)}, resume=True, warn=lambda m: None)
    second = az.analyze_set(target, draft, "tiny", cfg, prompt_ids=prompts, progress=False, log=lambda *a: None,
                            journal=journal)
    assert journal.reused == n_units - 1
    assert second.moments.mu == first.moments.mu and second.oracle.mean == first.oracle.mean
    assert second.drafter_exact.dynamic.mean == first.drafter_exact.dynamic.mean
    for kind in first.drafters:
        assert second.drafters[kind].by_capacity.keys() == first.drafters[kind].by_capacity.keys()


def test_set_analysis_round_trips_through_json(pair):
    target, draft = pair
    res = az.analyze_set(target, draft, "tiny", _tiny_config(), prompt_ids=[[1, 2, 3], [4, 5]], progress=False,
                         log=lambda *a: None)
    data = json.loads(json.dumps(to_jsonable(res)))
    assert set(data["oracle_sd"]["by_capacity"]) == {"4"}                  # int P keys become strings in JSON
    back = from_jsonable(az.SetAnalysis, data)
    assert isinstance(back.config, az.AnalyzeConfig) and back.config.capacities == (1, 4)
    assert list(back.oracle_sd.by_capacity) == [4] and list(back.tightest_bound) == [1, 4]   # ... and ints again
    assert to_jsonable(back) == data


def test_committed_real_model_results_load_and_render_to_the_same_numbers():
    """The run of 2026-12-02 (docs/results/reproduce-pankratov-20261202, measured by the old analysis layer
    with the fp32 target) loads into the typed results; the re-rendered moments table (i) and synthetic
    checks (iii) carry exactly the committed numbers (the per-P tables now show the SE by sampled text,
    so (ii) differs on purpose)."""
    from specbound.experiments.pankratov import PankratovResult
    from specbound.experiments.pankratov_report import report_markdown

    old_dir = DOCS / "reproduce-pankratov-20261202"
    result = from_jsonable(PankratovResult, json.loads((old_dir / "results.json").read_text()))
    for analysis in result.llm.analyses:
        analysis.finalize()
    numbers = re.compile(r"-?\d+\.\d+")

    def sections(text):
        table = text[text.index("## (i)"):text.index("## (ii)")]
        return numbers.findall(table), numbers.findall(text[text.index("## (iii)"):])

    old_table, old_synth = sections((old_dir / "report.md").read_text())
    new_table, new_synth = sections(report_markdown(result))
    assert len(old_table) > 70 and new_table == old_table
    assert len(old_synth) > 40 and new_synth == old_synth
    assert result.claims is None and result.llm.target_precision == "fp32"


# ------------------------------------------------------------------ Yin et al. Table 1 on a tiny pair
def test_table1_on_tiny_models(pair, tmp_path, monkeypatch):
    from specbound.experiments import yin_table1
    from specbound.experiments.yin import Settings
    from specbound.experiments.yin_table1 import measure_table1

    target, draft = pair
    s = Settings.make(True, prompts=3, samples=2, tokens=24, gamma=3, table_eps=(0.1, 0.8), forms="both",
                      llm_budget=600.0)
    prompts = [[1, 2, 3], [4, 5, 6, 7], [9, 9]]
    path = tmp_path / "partial.jsonl"
    t1 = measure_table1(target, draft, ["p0", "p1", "p2"], prompts, {0}, s, journal=PartialResults(path, {}))
    # --resume: calibration and every (prompt, sample) unit come back from the journal, identical
    monkeypatch.setattr(yin_table1, "generate_unit", lambda *a, **k: pytest.fail("unit measured again"))
    monkeypatch.setattr(yin_table1, "calibrate", lambda *a, **k: pytest.fail("calibration measured again"))
    again = measure_table1(target, draft, ["p0", "p1", "p2"], prompts, {0}, s,
                           journal=PartialResults(path, {}, resume=True))
    assert to_jsonable(again.rows) == to_jsonable(t1.rows)
    assert t1.status == "ran" and t1.forms == ["additive", "ratio"] and t1.units_done == 6
    assert len(t1.generations) == 6 * 2 * 2 * 2 and len(t1.rows) == 4
    cal = t1.calibration
    for form in ("additive", "ratio"):
        rej = [r.rejection for r in cal.forms[form]]
        assert rej[0] >= rej[1] >= rej[2] and all(r.opt_bias <= r.uno_bias + 1e-12 for r in cal.forms[form])
    for g in t1.generations:
        assert not g.lossless and 0 <= g.rejections <= g.verified and g.expected_bias >= 0
        assert g.judged_tokens <= len(g.tokens) and np.isfinite(g.score)
    n_rej = sum(r.opt.rejections + r.uno.rejections for r in t1.rows)
    exact = sum(r.opt.expected_rejections_visited + r.uno.expected_rejections_visited for r in t1.rows)
    var = sum(g.exact_rejection_var for g in t1.generations)
    assert abs(n_rej - exact) <= 4 * np.sqrt(var)          # rejections vs their martingale compensator
    for r in t1.rows:
        assert r.wins + r.losses + r.ties == r.pairs == 6 and 0 <= r.win_rate <= 1
        assert r.theory["rejection"] <= r.theory["sd_rejection"]


# ------------------------------------------------------------------ one stop-token finder
def test_stop_token_ids_unites_config_tokenizer_and_end_of_turn():
    from types import SimpleNamespace

    from specbound.models.tokens import stop_token_ids

    class Tok:
        eos_token_id = 5
        unk_token_id = 0

        def convert_tokens_to_ids(self, text):
            return {"<|im_end|>": 7, "<|endoftext|>": 5}.get(text, 0)

    model = SimpleNamespace(model=SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[9, 5])),
                            tokenizer=Tok(), vocab_size=100)
    assert stop_token_ids(model) == [5, 7, 9]
    assert stop_token_ids(SimpleNamespace(tokenizer=None)) == []
    assert stop_token_ids(SimpleNamespace(tokenizer=SimpleNamespace(eos_token_id=3))) == [3]


# ------------------------------------------------------------------ `specbound analyze` end to end (tiny models)
class _CharTokenizer:
    """Characters → ids 1..47; no chat template (chat prompts are used as raw text, with a warning)."""

    eos_token_id = 0
    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1 + ord(c) % 47 for c in text[:40]]}


def test_analyze_command_survives_ctrl_c_and_resumes(pair, tmp_path, monkeypatch):
    from specbound.models import loading

    target, draft = pair
    target.tokenizer = draft.tokenizer = _CharTokenizer()
    monkeypatch.setattr(loading, "load_model", lambda name, progress=True, int8=False: draft if "0.5b" in name else target)
    argv = ["analyze", "--prompts", "builtin-code", "--quick", "--n-prompts", "2", "--tokens", "6",
            "--capacities", "1,4", "--oracle-positions", "2", "--drafter-tokens", "6", "--no-progress",
            "--out", str(tmp_path)]
    real = az.drafter_runs

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(az, "drafter_runs", interrupted)
    assert main(argv) == 130                                  # Ctrl-C in the middle of the analysis
    partial = tmp_path / "partial.jsonl"
    done = len(partial.read_text().splitlines()) - 1
    assert done >= 2 + 2 + 2 and not (tmp_path / "analyze.json").exists()
    monkeypatch.setattr(az, "drafter_runs", real)
    assert main(argv + ["--resume"]) == 0
    result = json.loads((tmp_path / "analyze.json").read_text())
    assert result["set"] == "builtin-code" and set(result["drafters"]) == {"chain", "dynamic"}
    assert (tmp_path / "report.html").stat().st_size > 0 and not partial.exists()
    # other settings cannot resume from a different run's partial results
    partial.write_text(json.dumps({"specbound_partial": 1, "fingerprint": {"other": 1}}) + "\n")
    assert main(argv + ["--resume"]) == 2
