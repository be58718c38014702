"""The default target chosen by measurement (specbound.measure.deployment): the pricing picks the torch
target only where its predicted speculative rate beats plain llama.cpp by MIN_GAIN (checked against rates
computed here by hand from the chain formula), falls back to plain llama.cpp otherwise; the kept decision
is keyed by everything that changes it, validated when read, and a bad file or entry is measured again."""
import json

import pytest

from specbound.errors import SpecboundError
from specbound.measure import deployment as dep
from specbound.measure.deployment import Candidate, Deployment, price


def chain_rate(alpha: float, gamma: int, d1: float, t1: float, t8: float) -> float:
    """Tokens/s of chains of γ at one acceptance α: (1 − α^(γ+1)) / (1 − α) tokens per round, for γ draft
    reads and one target pass over γ + 1 tokens (t linear between k = 1 and 8)."""
    t = t1 + (t8 - t1) * gamma / 7
    return (1 - alpha ** (gamma + 1)) / (1 - alpha) / (gamma * d1 + t)


def test_a_fast_target_is_chosen_at_its_best_chain_rate():
    d = price([Candidate("kquant", "k", 0.030, 0.040), Candidate("llamacpp", "l", 0.027, 0.040)], 0.009, 0.8)
    assert d.engine == "torch" and d.target_precision == "kquant" and not d.plain_llamacpp
    kq = d.candidate("kquant")
    expected = max(chain_rate(0.8, g, 0.009, 0.030, 0.040) for g in range(1, 8))
    assert kq.predicted_rate == pytest.approx(expected, rel=1e-9)
    assert kq.predicted_rate == pytest.approx(chain_rate(0.8, kq.gamma, 0.009, 0.030, 0.040), rel=1e-9)
    assert d.candidate("llamacpp").predicted_rate == pytest.approx(1 / 0.027)
    assert "kquant" in d.describe() and "chosen by measurement" in d.describe()


def test_a_slow_target_falls_back_to_plain_llama_cpp():
    """The portable path measured here: t(1) 0.33 s, t(8) 2.4 s against llama.cpp's 0.024 s."""
    d = price([Candidate("kquant", "k", 0.33, 2.4), Candidate("llamacpp", "l", 0.024, 0.05)], 0.009, 0.8)
    assert d.plain_llamacpp and d.target_precision is None
    assert d.describe().startswith("decoding plainly on llama.cpp")


def test_the_margin_decides_near_ties():
    """A torch target predicted 1.05x plain llama.cpp is not enough (MIN_GAIN = 1.08); 1.12x is."""
    base = Candidate("kquant", "k", 0.030, 0.040)
    rate = max(chain_rate(0.8, g, 0.009, 0.030, 0.040) for g in range(1, 8))
    for gain, plain in ((1.05, True), (1.12, False)):
        llama_t1 = gain / rate
        d = price([Candidate(**vars(base)), Candidate("llamacpp", "l", llama_t1, 0.05)], 0.009, 0.8)
        assert d.plain_llamacpp is plain, gain


def test_without_llama_cpp_the_torch_target_is_kept_and_without_both_it_is_an_error():
    d = price([Candidate("kquant", "k", 0.33, 2.4)], 0.03, 0.8)
    assert d.target_precision == "kquant"
    with pytest.raises(SpecboundError, match="no target"):
        price([], 0.03, 0.8)


def test_the_kept_decision_reads_back_and_bad_state_is_dropped(tmp_path, monkeypatch):
    path = tmp_path / "deployment.json"
    d = price([Candidate("kquant", "k", 0.030, 0.040), Candidate("llamacpp", "l", 0.027, 0.040)], 0.009, 0.8)
    d.measured_at = "2026-12-07 12:00"
    dep._write("key-a", d, path)
    back = dep.read_deployments(path)["key-a"]
    assert back.source == "cache" and back.target_precision == "kquant" and back.candidates == d.candidates
    raw = json.loads(path.read_text())
    raw["entries"]["key-b"] = dict(raw["entries"]["key-a"], engine="torch", target_precision=None)
    raw["entries"]["key-c"] = {"engine": "llamacpp"}
    path.write_text(json.dumps(raw))
    with pytest.warns(UserWarning, match="dropping a bad entry"):
        kept = dep.read_deployments(path)
    assert set(kept) == {"key-a"}
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable"):
        assert dep.read_deployments(path) == {}
    path.write_text(json.dumps({"version": 0, "entries": {}}))
    with pytest.warns(UserWarning, match="not a version"):
        assert dep.read_deployments(path) == {}


def test_the_key_changes_with_the_forced_path_the_files_and_the_threads(tmp_path, monkeypatch):
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    target.write_bytes(b"x")
    draft.write_bytes(b"y")
    monkeypatch.delenv("SPECBOUND_KQUANT_PATH", raising=False)
    base = dep.deployment_key(target, draft, 2)
    assert dep.deployment_key(target, draft, 2) == base
    assert dep.deployment_key(target, draft, 1) != base
    monkeypatch.setenv("SPECBOUND_KQUANT_PATH", "portable")
    assert dep.deployment_key(target, draft, 2) != base
    monkeypatch.delenv("SPECBOUND_KQUANT_PATH")
    target.write_bytes(b"xx")                        # another file (size changes)
    assert dep.deployment_key(target, draft, 2) != base


def test_a_given_precision_or_a_hugging_face_directory_is_never_measured(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from specbound.cli import output
    from specbound.cli.arguments import choose_target

    def refuse(**_):
        raise AssertionError("measured")

    monkeypatch.setattr(dep, "choose_deployment", refuse)
    args = SimpleNamespace(target_precision="int8", target=None, draft=None, draft_engine="torch")
    assert choose_target(args, output.console(stderr=True)) == (None, {}) and args.target_precision == "int8"
    (tmp_path / "config.json").write_text("{}")
    args = SimpleNamespace(target_precision=None, target=str(tmp_path), draft=None, draft_engine="torch")
    assert choose_target(args, output.console(stderr=True)) == (None, {}) and args.target_precision == "int8"
