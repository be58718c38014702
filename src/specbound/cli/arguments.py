"""Argument types and checks shared by the commands (no torch, nothing heavy).

Two kinds of check, one rule: what argparse can judge from one token alone (an integer list that
does not parse) is an argparse ``type`` and exits with argparse's usage message; everything else
(ranges that need a sentence of context, options that depend on each other) raises
:class:`~specbound.errors.SpecboundError` from the command's ``run`` before any model loads, and
:func:`specbound.cli.main` prints it in the one error format.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Collection

from ..errors import SpecboundError

__all__ = ["TARGET_PRECISION_HELP", "add_compile", "add_draft_quant", "choose_target", "at_least", "int_list", "name_list", "positive_threads"]


def int_list(minimum: int | None = None) -> Callable[[str], list[int]]:
    """An argparse ``type`` for comma-separated integers, e.g. ``1,2,4`` (at least one).

    ``minimum`` None leaves the range to the command (``theory --drafts`` explains its range, and why,
    in its own error); an integer makes smaller values an argparse error (``analyze --capacities``
    takes integers >= 1).
    """

    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one integer")
        if minimum is not None and any(v < minimum for v in values):
            raise argparse.ArgumentTypeError(f"expected integers >= {minimum}, got {text!r}")
        return values

    return parse


def name_list(text: str, valid: Collection[str], flag: str) -> tuple[str, ...]:
    """Comma-separated names, each one of ``valid`` (at least one), else a clear error naming ``flag``."""
    given = tuple(name for name in text.split(",") if name)
    bad = [name for name in given if name not in valid]
    if bad or not given:
        raise SpecboundError(f"{flag}: unknown {bad or 'empty list'}; choose from {', '.join(valid)}")
    return given


def at_least(args, minimum: int, *names: str) -> None:
    """Every option in ``names`` that was given must be an integer >= ``minimum`` (clear error otherwise)."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < minimum:
            flag = "--" + name.replace("_", "-")
            raise SpecboundError(f"{flag} must be >= {minimum}, got {value}")


def positive_threads(args) -> None:
    """``--threads`` of the studies: None (torch's choice) or >= 1."""
    at_least(args, 1, "threads")


def add_draft_quant(p) -> None:
    """``--draft-quant``: the weights of a draft run on llama.cpp (``specbound.options.DRAFT_QUANTS``)."""
    from ..options import DEFAULT_DRAFT_QUANT, DRAFT_QUANTS

    p.add_argument("--draft-quant", default=DEFAULT_DRAFT_QUANT, choices=list(DRAFT_QUANTS),
                   help="weights of a draft on llama.cpp: q4_0 (the default: its GGUF re-quantised once and "
                        "cached, ~half the time per drafted token here, a few percent less acceptance) or file "
                        "(the GGUF as shipped); the draft only proposes, so the output law is the same")


def add_compile(p) -> None:
    """``--compile`` / ``--no-compile``: a quantised torch target's reads through torch.compile
    (``specbound.options.resolve_compile``: on for the kquant and int8 targets unless ``--no-compile``)."""
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="read the quantised target (kquant, int8) through torch.compile (inductor; their default): "
                        "the same logits bit for bit, less time per pass here; a process compiles at load "
                        "(a few seconds, ~30 s the first time on a machine); --no-compile reads it eagerly")


#: ``--target-precision``'s help, one text for generate, bench and advise.
TARGET_PRECISION_HELP = (
    "the target you run (default, for the packaged model or a .gguf file: chosen by timing the candidates once on "
    "this machine — kquant on this CPU's kernel path, or plain llama.cpp where nothing speculative is predicted to "
    "beat it; a Hugging Face directory: int8): kquant = the GGUF file's own Q4_K/Q6_K weights read by specbound's kernel, int8 = int8 weights and "
    "activations (fbgemm), fp32 = the GGUF dequantised to float32; the quantised ones are different models, and "
    "decoding is lossless with respect to the one you run")


def choose_target(args, console) -> tuple:
    """The target a command decodes with: ``--target-precision`` as given, or the default chosen by
    measurement on this machine (:mod:`specbound.measure.deployment`), said in one line. Set ``args.target_precision`` and return ``(deployment, models)``: the measured decision (None when
    the precision was given, the target is not a GGUF file, or nothing but the int8 target can run) and
    the models its measurement loaded, by role, for the caller to decode with."""
    from ..measure.deployment import choose_deployment
    from ..models.kquant import kernel_available
    from ..models.loading import reads_gguf, resolve_target_precision
    from ..options import DEFAULT_TARGET_PRECISION, resolve_compile, resolve_draft_engine

    engine = resolve_draft_engine(getattr(args, "draft_engine", "auto"))
    if args.target_precision is not None or not reads_gguf(args.target) or \
            (not kernel_available() and engine != "llamacpp"):
        args.target_precision = resolve_target_precision(args.target_precision, args.target, warn=console.print)
        return None, {}
    with console.status("choosing the target for this machine (first use only: times each candidate)…"):
        deployment, models = choose_deployment(
            target=args.target, draft=args.draft, draft_quant=getattr(args, "draft_quant", "q4_0"),
            draft_engine=engine, compiled=resolve_compile(getattr(args, "compile", None), DEFAULT_TARGET_PRECISION))
    console.print(deployment.describe())
    args.target_precision = deployment.target_precision or (DEFAULT_TARGET_PRECISION if kernel_available()
                                                            else resolve_target_precision(None, args.target))
    return deployment, models
