"""Command line: thin wrappers over the library. `specbound --help` lists the sub-commands."""
from __future__ import annotations

import argparse
import json
import sys

from .errors import SpecboundError


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


# ---------------------------------------------------------------------------- theory
def cmd_theory(args) -> int:
    from .theory import MarkovChain, batch_expected_rejections, batch_rejections_limit, expected_rejections

    if args.states < 1 or args.horizon < 1:
        raise SpecboundError("--states and --horizon must be >= 1")
    target = MarkovChain.random(args.states, horizon=args.horizon, concentration=args.concentration,
                                seed=args.seed)
    draft = target.perturbed(args.draft_noise, seed=args.seed + 1)
    rows = []
    for m in args.drafts:
        if m < 1:
            raise SpecboundError(f"--drafts values must be >= 1, got {m}")
        value = expected_rejections(target=target, draft=draft, horizon=args.horizon) if m == 1 else \
            batch_expected_rejections(target=target, draft=draft, horizon=args.horizon, drafts=m)
        rows.append({"drafts": m, "expected_rejections": value,
                     "speedup": args.horizon / value if value > 0 else float("inf"),
                     "formula": "Yin et al. Thm 1" if m == 1 else "Yin et al. Thm 3 (design B)"})
    limit = batch_rejections_limit(target=target, draft=draft, horizon=args.horizon)
    out = {"chain": {"states": args.states, "horizon": args.horizon, "seed": args.seed,
                     "concentration": args.concentration, "draft_noise": args.draft_noise},
           "rows": rows, "batch_limit": {"expected_rejections": limit, "speedup": args.horizon / limit
                                         if limit > 0 else float("inf"), "formula": "Yin et al. Prop 1"}}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Random non-stationary chain: S={args.states}, T={args.horizon}, seed={args.seed} "
                        f"(draft = target mixed {args.draft_noise:g} with noise)")
    table.add_column("drafts M", justify="right")
    table.add_column("E[N_rej]", justify="right")
    table.add_column("speed-up T/E[N_rej]", justify="right")
    table.add_column("formula")
    for r in rows:
        table.add_row(str(r["drafts"]), f"{r['expected_rejections']:.4f}", f"{r['speedup']:.3f}", r["formula"])
    table.add_row("∞", f"{limit:.4f}", f"{out['batch_limit']['speedup']:.3f}", "Yin et al. Prop 1")
    Console().print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specbound", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("theory", help="exact expected rejections and speed-up on a random Markov chain (Yin et al.)")
    p.add_argument("--states", type=int, default=7, help="number of states (tokens), default 7")
    p.add_argument("--horizon", type=int, default=50, help="number of generated tokens T, default 50")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concentration", type=float, default=0.5, help="Dirichlet concentration of rows")
    p.add_argument("--draft-noise", type=float, default=0.5,
                   help="draft = (1-w)·target + w·random rows; w in [0,1], default 0.5")
    p.add_argument("--drafts", type=_int_list, default=[1], help="batch sizes M, e.g. 1,2,4 (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_theory)

    for register in _EXTRA_COMMANDS:
        register(sub)
    return parser


def _register_real_model_commands(sub) -> None:
    from .cli_generate import register
    register(sub)


def _register_analysis_commands(sub) -> None:
    """`analyze` and `reproduce yin|pankratov`. Each lives in specbound.analysis.<module>, which
    provides ``add_arguments(parser)`` and ``run(args) -> int``; imported only when used."""
    import importlib

    def lazy(module_name):
        def run(args):
            return importlib.import_module(f"specbound.analysis.{module_name}").run(args)
        return run

    def add(parser, module_name):
        try:
            importlib.import_module(f"specbound.analysis.{module_name}").add_arguments(parser)
        except ModuleNotFoundError as exc:
            if exc.name != f"specbound.analysis.{module_name}":
                raise
        parser.set_defaults(func=lazy(module_name))

    p = sub.add_parser("analyze", help="measure mu, mu2, oracle E[X*](P), bounds and drafters on real models "
                                        "(Pankratov & Alistarh)")
    add(p, "analyze")
    p = sub.add_parser("reproduce", help="regenerate the papers' figures and tables in kind")
    rsub = p.add_subparsers(dest="paper", required=True)
    add(rsub.add_parser("yin", help="Yin et al. 2024: Fig. 2-4 and Table 1 in kind"), "reproduce_yin")
    add(rsub.add_parser("pankratov", help="Pankratov & Alistarh 2026: moments table and Fig. 2 in kind"),
        "reproduce_pankratov")


_EXTRA_COMMANDS: list = [_register_real_model_commands, _register_analysis_commands]


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except SpecboundError as exc:
        print(f"specbound: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
