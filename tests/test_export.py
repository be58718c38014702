"""Exporters of a speculative-decoding recommendation to vLLM, SGLang and llama.cpp server settings.

The expected option names are the documented ones listed in the docstring of ``specbound.export``;
every test parses what it checks (JSON with json.loads, command lines with shlex.split) and compares
whole key sets / flag maps, so an extra, missing or misspelt field fails.
"""
import json
import shlex

import pytest

from specbound.errors import SpecboundError
from specbound.export import (
    Recommendation, export_all, export_llamacpp_server, export_sglang, export_vllm,
    to_llamacpp_server, to_sglang, to_vllm,
)

TARGET = "/models/target model's.gguf"  # space and quote: must survive shell quoting
DRAFT = "/models/draft $HOME.gguf"

CHAIN = Recommendation(TARGET, DRAFT, "chain", 5, min_draft_tokens=2, draft_p_min=0.6, temperature=0.7,
                       notes=("acceptance 0.71 per token", "second\nline"))
PLAIN_CHAIN = Recommendation(TARGET, DRAFT, "chain", 4)
TREE = Recommendation(TARGET, DRAFT, "tree", 3, tree_capacity=8, tree_topk=2)
NGRAM = Recommendation(TARGET, None, "ngram", 4, ngram_min=2, ngram_max=5)
NGRAM_DEFAULT = Recommendation(TARGET, None, "ngram", 6)
NONE = Recommendation(TARGET, DRAFT, "none", 0, temperature=0.0)


# ------------------------------------------------------------------------------------------ parsing

def code_lines(text: str) -> list[str]:
    """The non-comment, non-empty lines."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def warnings_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("# WARNING:")]


def parse_vllm(text: str):
    """(speculative_config, argv) from to_vllm's text: a JSON line, then the command line."""
    lines = code_lines(text)
    assert len(lines) == 2, text
    return json.loads(lines[0]), shlex.split(lines[1])


def parse_command(text: str) -> list[str]:
    lines = code_lines(text)
    assert len(lines) == 1, text
    return shlex.split(lines[0])


def flags(argv: list[str], prefix: int) -> dict[str, str | None]:
    """``--flag value`` pairs after the first ``prefix`` words; a flag followed by a flag maps to None."""
    out, rest, i = {}, argv[prefix:], 0
    while i < len(rest):
        assert rest[i].startswith("-"), (rest[i], argv)
        assert rest[i] not in out, f"{rest[i]} given twice in {argv}"
        if i + 1 < len(rest) and not rest[i + 1].startswith("-"):
            out[rest[i]] = rest[i + 1]
            i += 2
        else:
            out[rest[i]] = None
            i += 1
    return out


# --------------------------------------------------------------------------------------------- vLLM

def test_vllm_chain_exact_keys_and_command():
    config, argv = parse_vllm(to_vllm(CHAIN))
    assert config == {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 5}
    assert argv[:3] == ["vllm", "serve", TARGET]
    assert flags(argv, 3) == {"--speculative-config": argv[4]}
    assert json.loads(argv[4]) == config


def test_vllm_chain_says_what_it_cannot_express():
    text = to_vllm(CHAIN)
    warnings = warnings_of(text)
    assert len(warnings) == 2
    assert any("min_draft_tokens=2 not exported" in w for w in warnings)
    assert any("draft_p_min=0.6 not exported" in w for w in warnings)
    assert "send temperature=0.7 with each request" in text
    assert "# note: acceptance 0.71 per token" in text and "# note: line" in text
    assert not warnings_of(to_vllm(PLAIN_CHAIN))


def test_vllm_tree_falls_back_to_chain_of_its_depth():
    text = to_vllm(TREE)
    config, _ = parse_vllm(text)
    assert config == {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 3}
    assert "speculative_token_tree" not in config
    (warning,) = warnings_of(text)
    assert "cannot draft a tree" in warning and "chain of the tree's depth" in warning


def test_vllm_ngram():
    config, argv = parse_vllm(to_vllm(NGRAM))
    assert config == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    assert json.loads(argv[4]) == config
    config, _ = parse_vllm(to_vllm(NGRAM_DEFAULT))
    assert config == {"method": "ngram", "num_speculative_tokens": 6}
    assert not warnings_of(to_vllm(NGRAM))


def test_vllm_none_serves_plain():
    text = to_vllm(NONE)
    config, argv = parse_vllm(text)
    assert config is None
    assert argv == ["vllm", "serve", TARGET]
    assert export_vllm(NONE).config is None
    assert not warnings_of(text)


# ------------------------------------------------------------------------------------------- SGLang

SGLANG_PREFIX = ["python", "-m", "sglang.launch_server", "--model-path", TARGET]


def test_sglang_chain():
    argv = parse_command(to_sglang(CHAIN))
    assert argv[:5] == SGLANG_PREFIX
    assert flags(argv, 5) == {
        "--speculative-algorithm": "STANDALONE",
        "--speculative-draft-model-path": DRAFT,
        "--speculative-num-steps": "5",
        "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "6",  # 5 drafted + the root
    }
    warnings = warnings_of(to_sglang(CHAIN))
    assert len(warnings) == 2
    assert any("min_draft_tokens=2 not exported" in w for w in warnings)
    assert any("draft_p_min=0.6 not exported" in w for w in warnings)


def test_sglang_tree():
    argv = parse_command(to_sglang(TREE))
    assert flags(argv, 5) == {
        "--speculative-algorithm": "STANDALONE",
        "--speculative-draft-model-path": DRAFT,
        "--speculative-num-steps": "3",
        "--speculative-eagle-topk": "2",
        "--speculative-num-draft-tokens": "9",  # P = 8 drafted + the root
        "--disable-overlap-schedule": None,
    }
    assert not warnings_of(to_sglang(TREE))


def test_sglang_tree_larger_than_its_candidate_pool_is_clamped_with_warning():
    # depth 3, topk 2: SGLang scores 2 + 2*4 = 10 candidates, the tree may hold 2 + 4 + 8 = 14 nodes
    rec = Recommendation(TARGET, DRAFT, "tree", 3, tree_capacity=14, tree_topk=2)
    text = to_sglang(rec)
    assert flags(parse_command(text), 5)["--speculative-num-draft-tokens"] == "11"
    (warning,) = warnings_of(text)
    assert "exported 10 instead of 14" in warning


def test_sglang_tree_of_topk_one_needs_no_overlap_switch():
    rec = Recommendation(TARGET, DRAFT, "tree", 3, tree_capacity=3, tree_topk=1)
    got = flags(parse_command(to_sglang(rec)), 5)
    assert got["--speculative-num-draft-tokens"] == "4"
    assert "--disable-overlap-schedule" not in got


def test_sglang_ngram():
    text = to_sglang(NGRAM)
    assert flags(parse_command(text), 5) == {
        "--speculative-algorithm": "NGRAM",
        "--speculative-num-draft-tokens": "5",
        "--speculative-ngram-max-bfs-breadth": "1",
    }
    (warning,) = warnings_of(text)
    assert "2..5 window is not exported" in warning
    assert not warnings_of(to_sglang(NGRAM_DEFAULT))


def test_sglang_none():
    assert parse_command(to_sglang(NONE)) == SGLANG_PREFIX
    assert not warnings_of(to_sglang(NONE))


# ---------------------------------------------------------------------------------------- llama.cpp

def test_llamacpp_chain_current_names():
    argv = parse_command(to_llamacpp_server(CHAIN))
    assert argv[:3] == ["llama-server", "--model", TARGET]
    assert flags(argv, 3) == {
        "--spec-type": "draft-simple",
        "--spec-draft-model": DRAFT,
        "--spec-draft-n-max": "5",
        "--spec-draft-n-min": "2",
        "--spec-draft-p-min": "0.6",
        "--temp": "0.7",
    }
    assert not warnings_of(to_llamacpp_server(CHAIN))


def test_llamacpp_chain_legacy_names():
    argv = parse_command(to_llamacpp_server(CHAIN, legacy_flags=True))
    assert flags(argv, 3) == {
        "--model-draft": DRAFT,
        "--draft-max": "5",
        "--draft-min": "2",
        "--draft-p-min": "0.6",
        "--temp": "0.7",
    }


def test_llamacpp_without_threshold_writes_defaults_out():
    got = flags(parse_command(to_llamacpp_server(PLAIN_CHAIN)), 3)
    assert got["--spec-draft-n-min"] == "0" and float(got["--spec-draft-p-min"]) == 0.0
    assert "--temp" not in got


def test_llamacpp_tree_falls_back_to_chain():
    text = to_llamacpp_server(TREE)
    assert flags(parse_command(text), 3) == {
        "--spec-type": "draft-simple",
        "--spec-draft-model": DRAFT,
        "--spec-draft-n-max": "3",
        "--spec-draft-n-min": "0",
        "--spec-draft-p-min": "0.0",
    }
    (warning,) = warnings_of(text)
    assert "cannot draft a tree" in warning and "3 tokens per round" in warning


def test_llamacpp_ngram():
    text = to_llamacpp_server(NGRAM)
    assert flags(parse_command(text), 3) == {
        "--spec-type": "ngram-simple",
        "--spec-ngram-simple-size-m": "4",
        "--spec-ngram-simple-size-n": "2",
    }
    (warning,) = warnings_of(text)
    assert "exported n=2" in warning
    assert flags(parse_command(to_llamacpp_server(NGRAM_DEFAULT)), 3) == {
        "--spec-type": "ngram-simple", "--spec-ngram-simple-size-m": "6"}
    assert flags(parse_command(to_llamacpp_server(NGRAM, legacy_flags=True)), 3) == {
        "--spec-type": "ngram-simple", "--draft-max": "4", "--spec-ngram-size-m": "4", "--spec-ngram-size-n": "2"}


def test_llamacpp_none():
    argv = parse_command(to_llamacpp_server(NONE))
    assert argv == ["llama-server", "--model", TARGET, "--temp", "0.0"]
    assert not warnings_of(to_llamacpp_server(NONE))


def test_no_removed_llamacpp_names_in_current_output():
    removed = {"--draft", "--draft-n", "--draft-max", "--draft-min", "--draft-n-min", "--spec-ngram-size-n",
               "--spec-ngram-size-m", "--spec-ngram-min-hits"}
    for rec in (CHAIN, PLAIN_CHAIN, TREE, NGRAM, NGRAM_DEFAULT, NONE):
        assert not removed & set(export_llamacpp_server(rec).argv)


# ----------------------------------------------------------------------------------- all + structure

def test_export_all_and_structured_exports_agree():
    for rec in (CHAIN, TREE, NGRAM, NONE):
        texts = export_all(rec)
        assert set(texts) == {"vllm", "sglang", "llama.cpp"}
        assert texts["vllm"] == to_vllm(rec)
        assert shlex.split(code_lines(texts["sglang"])[0]) == list(export_sglang(rec).argv)
        assert shlex.split(code_lines(texts["llama.cpp"])[0]) == list(export_llamacpp_server(rec).argv)
        assert shlex.split(export_vllm(rec).command) == list(export_vllm(rec).argv)


def test_every_text_names_its_documentation_source():
    for rec in (CHAIN, NONE):
        for text in export_all(rec).values():
            assert text.splitlines()[2].startswith("# docs: http")


# ---------------------------------------------------------------------------------------- validation

@pytest.mark.parametrize("kwargs, message", [
    (dict(method="chain", num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(method="chain", num_speculative_tokens=-1), "num_speculative_tokens"),
    (dict(method="chain", num_speculative_tokens=2.0), "num_speculative_tokens"),
    (dict(method="chain", num_speculative_tokens=True), "num_speculative_tokens"),
    (dict(method="chain", num_speculative_tokens=3, draft=None), "needs a draft model"),
    (dict(method="chain", num_speculative_tokens=3, draft=""), "draft must be a non-empty string"),
    (dict(method="tree", num_speculative_tokens=3), "tree_capacity"),
    (dict(method="tree", num_speculative_tokens=3, tree_capacity=8), "tree_topk"),
    (dict(method="tree", num_speculative_tokens=3, tree_capacity=2, tree_topk=2), "does not fit"),
    (dict(method="tree", num_speculative_tokens=3, tree_capacity=15, tree_topk=2), "does not fit"),
    (dict(method="chain", num_speculative_tokens=3, tree_capacity=8), "applies to method='tree' only"),
    (dict(method="chain", num_speculative_tokens=3, draft_p_min=1.5), "draft_p_min"),
    (dict(method="chain", num_speculative_tokens=3, draft_p_min=-0.1), "draft_p_min"),
    (dict(method="chain", num_speculative_tokens=3, draft_p_min=float("nan")), "draft_p_min"),
    (dict(method="chain", num_speculative_tokens=3, draft_p_min="0.5"), "draft_p_min"),
    (dict(method="ngram", num_speculative_tokens=3, draft=None, draft_p_min=0.5), "draft_p_min"),
    (dict(method="ngram", num_speculative_tokens=3), "draft must be None"),
    (dict(method="ngram", num_speculative_tokens=3, draft=None, ngram_min=4, ngram_max=2), "ngram_min=4"),
    (dict(method="chain", num_speculative_tokens=3, ngram_max=2), "ngram_min/ngram_max"),
    (dict(method="chain", num_speculative_tokens=3, min_draft_tokens=4), "min_draft_tokens=4"),
    (dict(method="chain", num_speculative_tokens=3, temperature=-1.0), "temperature"),
    (dict(method="chain", num_speculative_tokens=3, notes=(1,)), "notes"),
    (dict(method="greedy", num_speculative_tokens=3), "method must be one of"),
    (dict(method="chain", num_speculative_tokens=3, target=""), "target"),
    (dict(method="chain", num_speculative_tokens=3, target="a\nb"), "line breaks"),
])
def test_invalid_recommendations_raise(kwargs, message):
    args = dict(target=TARGET, draft=DRAFT)
    args.update(kwargs)
    with pytest.raises(SpecboundError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Recommendation(**args)


def test_valid_edge_cases():
    assert Recommendation(TARGET, DRAFT, "chain", 3, draft_p_min=0).draft_p_min == 0.0
    assert Recommendation(TARGET, DRAFT, "chain", 3, draft_p_min=1).draft_p_min == 1.0
    assert Recommendation(TARGET, None, "ngram", 3, ngram_max=4).ngram_min == 4  # the other bound mirrors it
    assert Recommendation(TARGET, None, "none", 0).draft is None
    assert Recommendation(TARGET, DRAFT, "chain", 3, notes="one note").notes == ("one note",)
    with pytest.raises(Exception):  # frozen
        CHAIN.method = "tree"
