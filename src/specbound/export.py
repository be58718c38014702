"""Speculative-decoding recommendations in the configuration format of serving engines.

A :class:`Recommendation` (what ``specbound advise`` concludes for a target/draft pair) is turned into a
vLLM ``speculative_config`` (JSON) and ``vllm serve ... --speculative-config`` line (:func:`to_vllm`), a
``python -m sglang.launch_server ...`` line (:func:`to_sglang`) and a ``llama-server ...`` line
(:func:`to_llamacpp_server`); :func:`export_all` gives all three, and the ``export_*`` functions the same
content as data (:class:`EngineExport`: argv, config, warnings). Every option name was read in the
engine's own documentation or source; where an engine cannot express part of a recommendation (vLLM
and llama-server draft chains only: a tree becomes the chain of its depth) the exporter emits the
closest supported setting and a ``# WARNING:`` line saying what changed, never an option that does not
exist. Lines starting with ``#`` are comments; the command line is shell-quoted (:func:`shlex.quote`).
The method mapping per engine and its sources (docs and commits read): docs/notes.md (`export.py`).
"""
from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass

from .errors import SpecboundError, int_at_least

__all__ = [
    "METHODS", "Recommendation", "EngineExport",
    "export_vllm", "export_sglang", "export_llamacpp_server",
    "to_vllm", "to_sglang", "to_llamacpp_server", "export_all",
]

METHODS = ("chain", "tree", "ngram", "none")

VLLM_DOCS = "https://docs.vllm.ai/en/v0.25.0/features/speculative_decoding/draft_model/ (vLLM docs v0.25.0)"
SGLANG_DOCS = ("https://github.com/sgl-project/sglang/blob/main/docs/docs/advanced_features/"
               "speculative_decoding.mdx (read at 009f3c99)")
LLAMACPP_DOCS = ("https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md (read at 00dc8057; "
                 "flag names after PR #22397/#22964)")
LLAMACPP_LEGACY_DOCS = ("https://github.com/ggml-org/llama.cpp/blob/master/docs/speculative.md (read at 067318e6, "
                        "before the PR #22397 rename)")


# ----------------------------------------------------------------------------------------------- input

def _int(value, what: str, minimum: int) -> int:
    """``value`` as an int ≥ ``minimum`` (bools and floats rejected), else a clear error."""
    return int_at_least(value, minimum, what)


def _float(value, what: str, low: float, high: float | None) -> float:
    """``value`` as a finite float in [low, high] (``high=None``: no upper bound), else a clear error."""
    span = f"[{low:g}, {high:g}]" if high is not None else f">= {low:g}"
    numeric = isinstance(value, (int, float)) or type(value).__module__ == "numpy"
    if not numeric or isinstance(value, bool) or type(value).__name__ == "bool_":
        raise SpecboundError(f"{what} must be a number in {span}, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecboundError(f"{what} must be a number in {span}, got {value!r}") from None
    if not math.isfinite(number) or number < low or (high is not None and number > high):
        raise SpecboundError(f"{what} must be a number in {span}, got {value!r}")
    return number


def _name(value, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SpecboundError(f"{what} must be a non-empty string (a model path or name), got {value!r}")
    if "\n" in value or "\r" in value or "\0" in value:
        raise SpecboundError(f"{what} must not contain line breaks or NUL characters, got {value!r}")
    return value


@dataclass(frozen=True)
class Recommendation:
    """What to serve: the input of the exporters (validated on construction).

    ``method`` is one of :data:`METHODS`: ``"chain"`` (the separate ``draft`` model drafts
    ``num_speculative_tokens`` = γ tokens per round); ``"tree"`` (a tree of ``tree_capacity`` = P nodes,
    root excluded, depth ``num_speculative_tokens`` = D, at most ``tree_topk`` = k children per node,
    D ≤ P ≤ k + k² + … + k^D); ``"ngram"`` (prompt lookup, no draft model, proposes up to γ tokens;
    ``ngram_min``/``ngram_max`` optionally give the n-gram sizes matched against the context, one given:
    the other mirrors it); ``"none"`` (speculation will not pay: plain serving; ``num_speculative_tokens``
    ≥ 0 is ignored, a ``draft`` that was measured may be kept for the record). ``min_draft_tokens`` (≤ γ)
    and ``draft_p_min`` (draft confidence below which drafting stops, in [0, 1]; draft-model methods only)
    are exported where the engine has a setting for them. ``temperature`` is the sampling temperature the
    recommendation was measured at. ``notes`` are free text the exporters copy into comments.
    """

    target: str
    draft: str | None
    method: str
    num_speculative_tokens: int
    tree_capacity: int | None = None
    tree_topk: int | None = None
    min_draft_tokens: int = 0
    draft_p_min: float | None = None
    temperature: float | None = None
    notes: tuple[str, ...] = ()
    ngram_min: int | None = None
    ngram_max: int | None = None

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731  (frozen)
        _name(self.target, "target")
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise SpecboundError(f"method must be one of {', '.join(map(repr, METHODS))}, got {self.method!r}")
        method = self.method
        speculative = method != "none"

        set_("num_speculative_tokens", _int(
            self.num_speculative_tokens,
            "num_speculative_tokens (tree depth D)" if method == "tree" else "num_speculative_tokens (γ)",
            1 if speculative else 0))
        depth = self.num_speculative_tokens

        if method in ("chain", "tree"):
            if self.draft is None:
                raise SpecboundError(f"method={method!r} needs a draft model: draft is None")
            _name(self.draft, "draft")
        elif method == "ngram" and self.draft is not None:
            raise SpecboundError(f"method='ngram' uses prompt lookup and no draft model: draft must be None, "
                                 f"got {self.draft!r}")
        elif self.draft is not None:
            _name(self.draft, "draft")

        if method == "tree":
            if self.tree_capacity is None:
                raise SpecboundError("method='tree' needs tree_capacity (P, drafted nodes per round), got None")
            if self.tree_topk is None:
                raise SpecboundError("method='tree' needs tree_topk (k, children per node), got None")
            capacity = _int(self.tree_capacity, "tree_capacity (P, drafted nodes per round)", 1)
            topk = _int(self.tree_topk, "tree_topk (k, children per node)", 1)
            most = sum(topk ** d for d in range(1, depth + 1))
            if not depth <= capacity <= most:
                raise SpecboundError(
                    f"tree_capacity={capacity} does not fit a tree of depth {depth} with at most {topk} "
                    f"children per node: need {depth} <= tree_capacity <= {most}")
            set_("tree_capacity", capacity)
            set_("tree_topk", topk)
        else:
            for name in ("tree_capacity", "tree_topk"):
                if getattr(self, name) is not None:
                    raise SpecboundError(f"{name} applies to method='tree' only, got {name}="
                                         f"{getattr(self, name)!r} with method={method!r}")

        set_("min_draft_tokens", _int(self.min_draft_tokens, "min_draft_tokens", 0))
        if self.min_draft_tokens and not speculative:
            raise SpecboundError(f"min_draft_tokens={self.min_draft_tokens} makes no sense with method='none'")
        if self.min_draft_tokens > depth:
            raise SpecboundError(f"min_draft_tokens={self.min_draft_tokens} exceeds num_speculative_tokens={depth}")

        if self.draft_p_min is not None:
            if method not in ("chain", "tree"):
                raise SpecboundError(f"draft_p_min is a draft-model confidence threshold: it applies to "
                                     f"method 'chain' or 'tree', not {method!r}")
            set_("draft_p_min", _float(self.draft_p_min, "draft_p_min", 0.0, 1.0))

        if self.temperature is not None:
            set_("temperature", _float(self.temperature, "temperature", 0.0, None))

        notes = self.notes
        if isinstance(notes, str):
            notes = (notes,)
        try:
            notes = tuple(notes)
        except TypeError:
            raise SpecboundError(f"notes must be a tuple of strings, got {self.notes!r}") from None
        for note in notes:
            if not isinstance(note, str):
                raise SpecboundError(f"notes must be strings, got {note!r} of type {type(note).__name__}")
        set_("notes", notes)

        lo, hi = self.ngram_min, self.ngram_max
        if lo is not None or hi is not None:
            if method != "ngram":
                raise SpecboundError(f"ngram_min/ngram_max apply to method='ngram' only, not {method!r}")
            lo = _int(lo, "ngram_min", 1) if lo is not None else None
            hi = _int(hi, "ngram_max", 1) if hi is not None else None
            lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)
            if lo > hi:
                raise SpecboundError(f"ngram_min={lo} exceeds ngram_max={hi}")
            set_("ngram_min", lo)
            set_("ngram_max", hi)

    def describe(self) -> str:
        """One line saying what is recommended."""
        g = self.num_speculative_tokens
        if self.method == "chain":
            text = f"chain: draft model {self.draft} drafts {g} token{'s' * (g != 1)} per round"
        elif self.method == "tree":
            text = (f"tree: draft model {self.draft} drafts a tree of {self.tree_capacity} nodes, depth {g}, "
                    f"at most {self.tree_topk} children per node")
        elif self.method == "ngram":
            text = f"ngram: prompt lookup proposes up to {g} token{'s' * (g != 1)} per round"
            if self.ngram_min is not None:
                text += f", matching {self.ngram_min}..{self.ngram_max}-grams"
        else:
            text = "none: speculative decoding will not pay here; serve the target alone"
        extras = []
        if self.min_draft_tokens:
            extras.append(f"min_draft_tokens={self.min_draft_tokens}")
        if self.draft_p_min is not None:
            extras.append(f"draft_p_min={self.draft_p_min:g}")
        if self.temperature is not None:
            extras.append(f"temperature={self.temperature:g}")
        return text + (f" ({', '.join(extras)})" if extras else "")


# ---------------------------------------------------------------------------------------------- output

@dataclass(frozen=True)
class EngineExport:
    """One engine's settings: the launch ``argv``, the vLLM ``config`` dict (None elsewhere or when no
    speculation), ``warnings`` (what the engine cannot express) and informational ``comments``."""

    engine: str
    argv: tuple[str, ...]
    config: dict | None
    warnings: tuple[str, ...]
    comments: tuple[str, ...]
    source: str

    @property
    def command(self) -> str:
        """The shell-quoted launch line."""
        return " ".join(shlex.quote(arg) for arg in self.argv)


def _comment_lines(prefix: str, text: str) -> list[str]:
    return [f"# {prefix}{line}".rstrip() for line in (text.splitlines() or [""])]


def _render(rec: Recommendation, export: EngineExport, sections: list[tuple[str, str]]) -> str:
    lines = [f"# specbound recommendation for {export.engine}", f"# {rec.describe()}",
             f"# docs: {export.source}"]
    for warning in export.warnings:
        lines += _comment_lines("WARNING: ", warning)
    for comment in export.comments:
        lines += _comment_lines("", comment)
    for note in rec.notes:
        lines += _comment_lines("note: ", note)
    for title, body in sections:
        lines.append(f"# {title}")
        lines.append(body)
    return "\n".join(lines) + "\n"


def _tree_as_chain_warning(rec: Recommendation, engine: str, why: str) -> str:
    return (f"{engine} cannot draft a tree from a separate draft model ({why}); exported the chain of the "
            f"tree's depth instead, {rec.num_speculative_tokens} tokens per round. The speed-up predicted for "
            f"the {rec.tree_capacity}-node tree does not carry over: ask specbound for the best chain.")


def _request_temperature_comment(rec: Recommendation) -> list[str]:
    if rec.temperature is None:
        return []
    return [f"sampling: measured at temperature={rec.temperature:g}; temperature is a per-request sampling "
            f"parameter, not a server setting: send temperature={rec.temperature:g} with each request"]


def _measured_draft_comment(rec: Recommendation) -> list[str]:
    if rec.method == "none" and rec.draft is not None:
        return [f"the draft {rec.draft} was measured and is not used"]
    return []


def export_vllm(rec: Recommendation) -> EngineExport:
    """vLLM ``speculative_config`` and ``vllm serve`` argv for ``rec`` (see the module docstring)."""
    warnings, comments = [], []
    config: dict | None = None
    g = rec.num_speculative_tokens
    if rec.method in ("chain", "tree"):
        config = {"method": "draft_model", "model": rec.draft, "num_speculative_tokens": g}
        if rec.method == "tree":
            warnings.append(_tree_as_chain_warning(
                rec, "vLLM", "method 'draft_model' drafts a chain; vLLM's only tree option, "
                "speculative_token_tree, belonged to the EAGLE proposer and is not in the current source"))
    elif rec.method == "ngram":
        config = {"method": "ngram", "num_speculative_tokens": g}
        if rec.ngram_min is not None:
            config["prompt_lookup_min"] = rec.ngram_min
            config["prompt_lookup_max"] = rec.ngram_max
        else:
            comments.append("prompt_lookup_min/prompt_lookup_max left to vLLM (5 and 5 when both are omitted)")
    else:
        comments.append("no speculative_config: serve without speculative decoding")
    if rec.min_draft_tokens:
        warnings.append(f"vLLM has no minimum draft length: min_draft_tokens={rec.min_draft_tokens} not exported")
    if rec.draft_p_min is not None:
        warnings.append(f"vLLM has no draft-confidence stop: draft_p_min={rec.draft_p_min:g} not exported; "
                        f"the draft always proposes {g} tokens")
    if rec.method in ("chain", "tree"):
        comments.append("method 'draft_model' needs a vLLM release with draft-model support "
                        "(the docs: not supported in vllm<=0.10.0)")
    comments += _request_temperature_comment(rec) + _measured_draft_comment(rec)
    argv = ["vllm", "serve", rec.target]
    if config is not None:
        argv += ["--speculative-config", json.dumps(config)]
    return EngineExport("vLLM", tuple(argv), config, tuple(warnings), tuple(comments), VLLM_DOCS)


def to_vllm(rec: Recommendation) -> str:
    """Text: comments, the ``speculative_config`` JSON on its own line (``null`` for no speculation), and
    the ``vllm serve`` command line."""
    export = export_vllm(rec)
    return _render(rec, export, [
        ("speculative_config (JSON; LLM(model=..., speculative_config=...) takes the same keys):",
         json.dumps(export.config)),
        ("launch:", export.command),
    ])


def export_sglang(rec: Recommendation) -> EngineExport:
    """SGLang ``launch_server`` argv for ``rec`` (see the module docstring)."""
    warnings, comments = [], []
    argv = ["python", "-m", "sglang.launch_server", "--model-path", rec.target]
    g = rec.num_speculative_tokens
    if rec.method == "chain":
        argv += ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", rec.draft,
                 "--speculative-num-steps", str(g), "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(g + 1)]
        comments.append(f"--speculative-num-draft-tokens counts the last accepted token: {g} drafted + 1")
    elif rec.method == "tree":
        k, capacity = rec.tree_topk, rec.tree_capacity
        pool = k + (g - 1) * k * k  # candidates SGLang scores: k at step 1, k*k at each later step
        kept = min(capacity, pool)
        if capacity > pool:
            warnings.append(f"SGLang keeps at most {pool} drafted nodes for depth {g} and topk {k} "
                            f"({k} + {g - 1}*{k}^2 candidates); exported {kept} instead of {capacity}")
        argv += ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", rec.draft,
                 "--speculative-num-steps", str(g), "--speculative-eagle-topk", str(k),
                 "--speculative-num-draft-tokens", str(kept + 1)]
        comments.append(f"--speculative-num-draft-tokens counts the last accepted token: {kept} drafted + 1")
        if k > 1:
            argv.append("--disable-overlap-schedule")
            comments.append("--disable-overlap-schedule: SGLang's overlap scheduler supports only "
                            "--speculative-eagle-topk 1")
            comments.append("SGLang grows the tree by top-k expansion and keeps the best nodes by draft score; "
                            "its shape can differ from the tree specbound measured. With --page-size > 1, "
                            "topk > 1 needs --attention-backend flashinfer or fa3")
    elif rec.method == "ngram":
        argv += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(g + 1),
                 "--speculative-ngram-max-bfs-breadth", "1"]
        comments.append(f"--speculative-num-draft-tokens counts the last accepted token: {g} drafted + 1; "
                        f"--speculative-ngram-max-bfs-breadth 1 drafts a chain, as measured (NGRAM is CUDA-only)")
        if rec.ngram_min is not None:
            warnings.append(f"SGLang matches n-grams with its own trie (--speculative-ngram-max-trie-depth); "
                            f"the {rec.ngram_min}..{rec.ngram_max} window is not exported (older releases had "
                            f"--speculative-ngram-min/max-match-window-size, absent from the current docs)")
    else:
        comments.append("no speculative flags: serve without speculative decoding")
    if rec.min_draft_tokens:
        warnings.append(f"SGLang has no minimum draft length: min_draft_tokens={rec.min_draft_tokens} not exported")
    if rec.draft_p_min is not None:
        warnings.append(f"SGLang has no draft-confidence stop: draft_p_min={rec.draft_p_min:g} not exported "
                        f"(--speculative-accept-threshold-* are lossy acceptance thresholds, not the same thing)")
    comments += _request_temperature_comment(rec) + _measured_draft_comment(rec)
    return EngineExport("SGLang", tuple(argv), None, tuple(warnings), tuple(comments), SGLANG_DOCS)


def to_sglang(rec: Recommendation) -> str:
    """Text: comments and the ``python -m sglang.launch_server`` command line."""
    export = export_sglang(rec)
    return _render(rec, export, [("launch:", export.command)])


def export_llamacpp_server(rec: Recommendation, *, legacy_flags: bool = False) -> EngineExport:
    """llama.cpp ``llama-server`` argv for ``rec`` (see the module docstring). ``legacy_flags=True``: the
    option names of builds before the April 2026 rename (ggml-org/llama.cpp PR #22397)."""
    warnings, comments = [], []
    argv = ["llama-server", "--model", rec.target]
    g = rec.num_speculative_tokens
    if rec.method in ("chain", "tree"):
        p_min = repr(rec.draft_p_min if rec.draft_p_min is not None else 0.0)
        if legacy_flags:
            argv += ["--model-draft", rec.draft, "--draft-max", str(g), "--draft-min", str(rec.min_draft_tokens),
                     "--draft-p-min", p_min]
        else:
            argv += ["--spec-type", "draft-simple", "--spec-draft-model", rec.draft,
                     "--spec-draft-n-max", str(g), "--spec-draft-n-min", str(rec.min_draft_tokens),
                     "--spec-draft-p-min", p_min]
        comments.append("draft length limits and p-min written out: their defaults differ between llama.cpp builds"
                        + ("" if rec.draft_p_min is not None else "; p-min 0 = no early stop, as measured"))
        if rec.method == "tree":
            warnings.append(_tree_as_chain_warning(
                rec, "llama-server", "it drafts one chain per slot; trees (-np, --draft-p-split) exist only "
                "in the llama-speculative example program"))
    elif rec.method == "ngram":
        if legacy_flags:
            argv += ["--spec-type", "ngram-simple", "--draft-max", str(g), "--spec-ngram-size-m", str(g)]
            size_n = "--spec-ngram-size-n"
        else:
            argv += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", str(g)]
            size_n = "--spec-ngram-simple-size-n"
        if rec.ngram_min is not None:
            argv += [size_n, str(rec.ngram_min)]
            if rec.ngram_min != rec.ngram_max:
                warnings.append(f"llama.cpp ngram-simple matches one n-gram size: exported n={rec.ngram_min}; "
                                f"the range up to {rec.ngram_max} is not expressible")
        comments.append("ngram-simple drafts the m tokens that followed the last match of the current n-gram")
        if rec.min_draft_tokens:
            warnings.append(f"ngram-simple has no minimum draft length (--spec-draft-n-min applies to draft "
                            f"models): min_draft_tokens={rec.min_draft_tokens} not exported")
    else:
        comments.append("no speculative flags: serve without speculative decoding")
    if rec.temperature is not None:
        argv += ["--temp", repr(rec.temperature)]
        comments.append(f"--temp {rec.temperature:g}: the server's default temperature, as measured "
                        f"(requests may override it)")
    comments.append("llama-server loads GGUF files: target and draft must be GGUF paths")
    if legacy_flags:
        comments.append("legacy option names, for llama.cpp builds from before the April 2026 rename"
                        + ("; --spec-type ngram-simple needs a build recent enough to have it"
                           if rec.method == "ngram" else ""))
    comments += _measured_draft_comment(rec)
    source = LLAMACPP_LEGACY_DOCS if legacy_flags else LLAMACPP_DOCS
    return EngineExport("llama.cpp server", tuple(argv), None, tuple(warnings), tuple(comments), source)


def to_llamacpp_server(rec: Recommendation, *, legacy_flags: bool = False) -> str:
    """Text: comments and the ``llama-server`` command line."""
    export = export_llamacpp_server(rec, legacy_flags=legacy_flags)
    return _render(rec, export, [("launch:", export.command)])


def export_all(rec: Recommendation) -> dict[str, str]:
    """``{"vllm": to_vllm(rec), "sglang": to_sglang(rec), "llama.cpp": to_llamacpp_server(rec)}``."""
    return {"vllm": to_vllm(rec), "sglang": to_sglang(rec), "llama.cpp": to_llamacpp_server(rec)}
