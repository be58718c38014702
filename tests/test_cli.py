"""The thin CLI: `specbound theory` prints Thm 1 and the predicted speed-up."""
import json

import pytest

from specbound.cli import main
from specbound.theory import MarkovChain, expected_rejections


def test_theory_json_matches_library(capsys):
    assert main(["theory", "--states", "5", "--horizon", "20", "--seed", "3", "--drafts", "1,4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    target = MarkovChain.random(5, horizon=20, concentration=0.5, seed=3)
    draft = target.perturbed(0.5, seed=4)
    exact = expected_rejections(target=target, draft=draft, horizon=20)
    assert out["rows"][0]["expected_rejections"] == pytest.approx(exact)
    assert out["rows"][0]["speedup"] == pytest.approx(20 / exact)
    assert out["rows"][1]["expected_rejections"] < exact          # batch drafting helps (Thm 3)
    assert out["batch_limit"]["expected_rejections"] <= out["rows"][1]["expected_rejections"]


def test_theory_table(capsys):
    assert main(["theory", "--horizon", "10"]) == 0
    text = capsys.readouterr().out
    assert "Thm 1" in text and "speed-up" in text


def test_theory_bad_input_is_a_clear_error(capsys):
    assert main(["theory", "--states", "0"]) == 2
    assert "--states" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["theory", "--drafts", "a,b"])


def test_generate_and_bench_reject_bad_options_before_loading_models(capsys):
    assert main(["generate", "--gamma", "zero"]) == 2
    assert "--gamma" in capsys.readouterr().err
    assert main(["bench", "--n-prompts", "0"]) == 2
    assert "--n-prompts" in capsys.readouterr().err
    assert main(["generate", "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err
    assert main(["generate", "--top-p", "1.5"]) == 2
    assert "top_p" in capsys.readouterr().err
