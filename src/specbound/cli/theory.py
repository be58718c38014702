"""`specbound theory`: exact expected rejections, target calls and speed-up on a random Markov chain
(Yin et al. 2024 Thm 1, Thm 3 design B, Prop. 1). No model: the chains are built from the options."""
from __future__ import annotations

import json

from ..errors import SpecboundError
from .arguments import int_list
from .output import console

HELP = "exact expected rejections, target calls and speed-up on a random Markov chain (Yin et al.)"

#: Largest batch size M the `theory` command accepts (the M → ∞ row is always printed, Prop. 1).
THEORY_MAX_DRAFTS = 100_000
#: Default memory limit of the `theory` command, in GB (10^9 bytes).
THEORY_DEFAULT_MAX_MEMORY_GB = 2.0


def add_arguments(p) -> None:
    p.add_argument("--states", type=int, default=7, help="number of states (tokens), default 7")
    p.add_argument("--horizon", type=int, default=50, help="number of generated tokens T, default 50")
    p.add_argument("--seed", type=int, default=0, help="seed of the random chain (>= 0)")
    p.add_argument("--concentration", type=float, default=0.5, help="Dirichlet concentration of rows")
    p.add_argument("--draft-noise", type=float, default=0.5,
                   help="draft = (1-w)·target + w·random rows; w in [0,1], default 0.5")
    p.add_argument("--drafts", type=int_list(), default=[1],
                   help=f"batch sizes M in [1, {THEORY_MAX_DRAFTS}], e.g. 1,2,4 (default 1); M > 1 is batch SD, "
                        "design B")
    p.add_argument("--max-memory-gb", type=float, default=THEORY_DEFAULT_MAX_MEMORY_GB,
                   help="refuse (before allocating) if the estimated peak memory exceeds this many GB "
                        f"(default {THEORY_DEFAULT_MAX_MEMORY_GB:g})")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def theory_memory_bytes(states: int, horizon: int) -> int:
    """Peak memory (bytes) the `theory` command needs for S = ``states``, T = ``horizon``, estimated before
    anything is allocated.

    Each non-stationary chain stores T·S² float64 (8 bytes). While the draft is built
    (``MarkovChain.perturbed``) three such arrays are alive: the target, the mixed rows, and either the
    (1 − w)·target temporary or the validated copy made by ``MarkovChain`` (plus one byte per entry for
    the validation masks): 26·T·S² bytes. Afterwards only the two chains stay, and the exact recursions
    (Thm 1, Thm 3 design B, Prop. 1) run one step at a time with at most 6 S×S float64 work arrays,
    whatever M is: 16·T·S² + 48·S² bytes. The estimate is the larger of the two; tests/test_cli.py checks
    it against the tracemalloc peak.
    """
    chain_entries = horizon * states * states
    return int(max(chain_entries * (3 * 8 + 2), chain_entries * 2 * 8 + 6 * 8 * states * states))


def _check_theory_args(args) -> None:
    """Cheap range checks, and the memory estimate, before any array is allocated."""
    import math

    if args.states < 1:
        raise SpecboundError(f"--states must be >= 1 (number of chain states), got {args.states}")
    if args.horizon < 1:
        raise SpecboundError(f"--horizon must be >= 1 (number of generated tokens T), got {args.horizon}")
    if args.seed < 0:
        raise SpecboundError(f"--seed must be >= 0, got {args.seed}")
    if not (math.isfinite(args.concentration) and args.concentration > 0):
        raise SpecboundError(f"--concentration must be a finite number > 0, got {args.concentration}")
    if not (math.isfinite(args.draft_noise) and 0 <= args.draft_noise <= 1):
        raise SpecboundError(f"--draft-noise must be in [0, 1] (mixing weight w), got {args.draft_noise}")
    for m in args.drafts:
        if not 1 <= m <= THEORY_MAX_DRAFTS:
            raise SpecboundError(
                f"--drafts values must be in [1, {THEORY_MAX_DRAFTS}], got {m} (the M → ∞ limit is always "
                "printed as its own row, Yin et al. 2024 Prop. 1)"
            )
    if not (math.isfinite(args.max_memory_gb) and args.max_memory_gb > 0):
        raise SpecboundError(f"--max-memory-gb must be a finite number > 0, got {args.max_memory_gb}")
    need = theory_memory_bytes(args.states, args.horizon)
    limit = args.max_memory_gb * 1e9
    if need > limit:
        raise SpecboundError(
            f"--states {args.states} --horizon {args.horizon} needs about {need / 1e9:.3g} GB "
            f"(T·S² = {args.horizon * args.states ** 2:,} float64 entries per chain, 3 such arrays at the peak), "
            f"above the limit of {args.max_memory_gb:g} GB; lower --states or --horizon, or raise --max-memory-gb"
        )


def run(args) -> int:
    """Check every option (and the memory estimate), then compute the rows and print them."""
    from ..theory import (
        MarkovChain, batch_expected_rejections, batch_expected_target_calls, batch_rejections_limit,
        batch_target_calls_limit, expected_rejections, expected_target_calls,
    )

    _check_theory_args(args)
    T = args.horizon
    target = MarkovChain.random(args.states, horizon=T, concentration=args.concentration, seed=args.seed)
    draft = target.perturbed(args.draft_noise, seed=args.seed + 1)      # an instance: see specbound.seeds
    pair = dict(target=target, draft=draft, horizon=T)

    def row(drafts, rejections, calls, formula, label):
        # the paper's T/E[N_rej] is undefined (null) when E[N_rej] is 0 up to float64 round-off (the
        # residual recursion leaves ~1e-17 for identical chains)
        return {"drafts": drafts, "expected_rejections": rejections, "expected_target_calls": calls,
                "speedup": T / calls,
                "paper_speedup_T_over_rejections": T / rejections if rejections > 1e-12 * T else None,
                "formula": formula, "label": label}

    rows = []
    for m in args.drafts:
        if m == 1:
            rows.append(row(1, expected_rejections(**pair), expected_target_calls(**pair),
                            "Yin et al. 2024 Thm 1 (Alg. 1, one draft sequence)", "Thm 1 · Alg. 1"))
        else:
            rows.append(row(m, batch_expected_rejections(**pair, drafts=m, design="B"),
                            batch_expected_target_calls(**pair, drafts=m, design="B"),
                            "Yin et al. 2024 Thm 3, design B (branch at round start)", "Thm 3 · design B"))
    limit = row("inf", batch_rejections_limit(**pair), batch_target_calls_limit(**pair),
                "Yin et al. 2024 Prop. 1, design B, M -> inf", "Prop. 1 · design B")
    out = {"chain": {"states": args.states, "horizon": T, "seed": args.seed,
                     "concentration": args.concentration, "draft_noise": args.draft_noise},
           "speedup_formula": "T / E[target calls], E[target calls] = E[N_rej] + 1 - P(R_T = 1) "
                              "(drafting to the horizon: one target call per round; Yin et al. 2024 "
                              "Assumption 1: drafts free, one target call O(1))",
           "rows": rows, "batch_limit": limit}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"Yin et al. 2024 on a random non-stationary chain: S={args.states}, T={T}, "
                        f"seed={args.seed}, draft = target mixed {args.draft_noise:g} with noise; "
                        "drafting to the horizon",
                  caption=escape("speed-up = T / E[target calls], E[target calls] = E[N_rej] + 1 − P(R_T = 1) "
                                 "(one target call per round; the last round may end by accepting position T). "
                                 "Yin et al.'s Assumption 1: drafting is free, one target call costs O(1). "
                                 "Design B: the M drafts compete only at each round's first token."))
    table.add_column("drafts M", justify="right")
    table.add_column(escape("E[N_rej]"), justify="right")
    table.add_column(escape("E[target calls]"), justify="right")
    table.add_column(escape("speed-up T/E[calls]"), justify="right")
    table.add_column("formula · design", no_wrap=True)
    for r in rows + [limit]:
        table.add_row("∞" if r["drafts"] == "inf" else str(r["drafts"]), f"{r['expected_rejections']:.4f}",
                      f"{r['expected_target_calls']:.4f}", f"{r['speedup']:.3f}",
                      escape(r["label"]))
    console().print(table)
    return 0
