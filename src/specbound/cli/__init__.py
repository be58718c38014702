"""Command line of specbound: ONE parser, ONE ``main``, ONE error format. `specbound --help` lists the commands.

Every command is a module of this package with ``HELP`` (its one-line summary), ``add_arguments(parser)``
and ``run(args) -> int``. The modules only parse, check arguments (cheap checks first: nothing loads a
model before they pass), call the library and write output; they import the library lazily, inside
``run``. Errors: a :class:`~specbound.errors.SpecboundError` prints ``specbound: error: <message>`` on
stderr (no traceback) and exits 2 (argparse's own usage errors also exit 2); Ctrl-C prints ``interrupted``
and exits 130; any other exit status is the command's own (e.g. 1: a damaged cache, a failed check).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import SpecboundError
from . import advise, analyze, assets, bench, generate, reproduce, serve, theory

__all__ = ["COMMANDS", "build_parser", "main"]

DESCRIPTION = ("lossless speculative decoding, and the theory that says how fast it can be "
               "(Yin et al. 2024; Pankratov & Alistarh 2026)")
#: The commands, in the order ``specbound --help`` lists them.
COMMANDS = {"generate": generate, "serve": serve, "bench": bench, "advise": advise, "analyze": analyze,
            "reproduce": reproduce, "theory": theory, "assets": assets}


def build_parser() -> argparse.ArgumentParser:
    """The one argument parser: every command of :data:`COMMANDS` (plus ``models``, the old name of
    ``assets list``)."""
    parser = argparse.ArgumentParser(prog="specbound", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    p = sub.add_parser("models", description="deprecated: the old name of `specbound assets list`")
    assets.add_list_arguments(p)
    p.set_defaults(run=assets.run_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; see the module docstring for the exit statuses and the error format."""
    from ..runtime import configure_process

    configure_process()                  # before building the parser: some commands' options import torch
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except SpecboundError as exc:
        print(f"specbound: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:            # clean-up already ran (e.g. a conversion's staging directory)
        print("interrupted", file=sys.stderr)
        return 130
