"""`specbound reproduce yin|pankratov`: regenerate the papers' figures and tables in kind.

One sub-command per paper, each a module with ``HELP``, ``add_arguments(parser)`` and ``run(args)``.
"""
from __future__ import annotations

from . import pankratov, yin

HELP = "regenerate the papers' figures and tables in kind"

#: The papers, in the order ``--help`` lists them.
PAPERS = {"yin": yin, "pankratov": pankratov}


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="paper", required=True, metavar="{" + ",".join(PAPERS) + "}")
    for name, module in PAPERS.items():
        module.add_arguments(sub.add_parser(name, help=module.HELP))


def run(args) -> int:
    return PAPERS[args.paper].run(args)
