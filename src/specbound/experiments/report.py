"""THE reporting layer shared by every study: numbers → markdown → HTML, JSON in and out, figures,
progress bars and output directories. Nothing here measures or computes theory.

* formatting: :func:`fmt`, :func:`pm` and pipe tables (:func:`md_table`);
* :func:`markdown_to_html`: the small markdown subset the reports use;
* JSON: :func:`to_jsonable` (the one converter: dataclasses, NumPy, non-finite → null, int keys →
  strings) and :func:`from_jsonable` (back to the typed results, int keys restored) — they live in
  :mod:`specbound.measure.records` (the journal needs them below the studies) and are re-exported here;
* files: :func:`check_output_dir` (BEFORE measuring), :func:`write_json`, :func:`write_text`
  (atomic), :func:`save_figure`;
* progress: :func:`progress_bar` (rich, on stderr), :class:`Stage` (from :mod:`specbound.measure.records`),
  :func:`note`.
"""
from __future__ import annotations

import html
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..errors import SpecboundError
from ..measure.records import Stage, from_jsonable, omitted_if_none, to_jsonable

__all__ = [
    "Stage", "check_output_dir", "fmt", "from_jsonable", "markdown_to_html", "md_table", "note", "omitted_if_none",
    "pm", "progress_bar", "save_figure", "to_jsonable", "write_json", "write_text",
]


# ---------------------------------------------------------------------------------------------------
# numbers and tables
# ---------------------------------------------------------------------------------------------------
def fmt(x, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals; "–" for None, NaN and ±inf; no "-0.000"."""
    if x is None or (isinstance(x, (float, np.floating)) and not math.isfinite(x)):
        return "–"
    if abs(x) < 0.5 * 10 ** -digits:
        x = 0.0
    return f"{x:.{digits}f}"


def pm(mean, se, digits: int = 3) -> str:
    """"mean ± se"."""
    return f"{fmt(mean, digits)} ± {fmt(se, digits)}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A pipe table: first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# markdown → HTML
# ---------------------------------------------------------------------------------------------------
_INLINE = [(re.compile(r"`([^`]+)`"), r"<code>\1</code>"), (re.compile(r"\*\*([^*]+)\*\*"), r"<b>\1</b>"),
           (re.compile(r"(?<![*\w])\*([^*\s][^*]*)\*(?![*\w])"), r"<i>\1</i>"),
           (re.compile(r"\[([^\]]+)\]\(([^)]+?)\.md\)"), r'<a href="\2.html">\1</a>'),
           (re.compile(r"\[([^\]]+)\]\(([^)]+)\)"), r'<a href="\2">\1</a>')]


def _inline(text: str) -> str:
    out = html.escape(text, quote=False)
    for pattern, replacement in _INLINE:
        out = pattern.sub(replacement, out)
    return out


def markdown_to_html(md: str, title: str = "specbound report") -> str:
    """The markdown subset our reports use: headings, pipe tables, lists, images, paragraphs,
    `code`, **bold**, *italic* and links (``x.md`` links become ``x.html``)."""
    body: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        img = re.fullmatch(r"!\[(.*)\]\((.+)\)", line.strip())
        if not line.strip():
            i += 1
        elif line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 6)
            body.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
            i += 1
        elif img:
            body.append(f'<figure><img src="{html.escape(img.group(2))}" alt="{html.escape(img.group(1))}" '
                        f'style="max-width:100%"><figcaption>{_inline(img.group(1))}</figcaption></figure>')
            i += 1
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                    rows.append(cells)
                i += 1
            out = ["<table>"]
            for k, cells in enumerate(rows):
                tag = "th" if k == 0 else "td"
                out.append("<tr>" + "".join(f"<{tag}>{_inline(c)}</{tag}>" for c in cells) + "</tr>")
            out.append("</table>")
            body.append("\n".join(out))
        elif line.startswith(("- ", "* ")):
            items = []
            while i < len(lines) and lines[i].startswith(("- ", "* ")):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            body.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "|", "- ", "* ", "![")):
                para.append(lines[i])
                i += 1
            body.append(f"<p>{_inline(' '.join(para))}</p>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:3px 8px;"
             "text-align:right}th{background:#eee}code{background:#f4f4f4}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


# ---------------------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------------------
def check_output_dir(path) -> Path:
    """Create ``path`` if needed and prove it writable (a probe file), BEFORE any measuring starts,
    so a bad ``--out`` fails in a second instead of after the measurement."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".specbound-write-test-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise SpecboundError(f"output directory {str(out)!r} is not writable ({exc.strerror or exc}); "
                             "choose another --out") from None
    return out


def write_text(path, text: str) -> Path:
    """Write ``text`` atomically (temporary file in the same directory, then rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(obj, path) -> Path:
    """:func:`to_jsonable` of ``obj``, indented, written atomically."""
    return write_text(path, json.dumps(to_jsonable(obj), indent=1))


def save_figure(fig, path, dpi: int = 120) -> Path:
    """Write a matplotlib figure as PNG and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------------------------------
def progress_bar(enabled: bool = True, console=None):
    """A rich progress display on stderr (disabled: draws nothing)."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=console or Console(stderr=True), disable=not enabled,
                    transient=False)


def note(message: str) -> None:
    """A timestamped line on stderr when it is not a terminal (nohup logs: rich bars draw only at the end)."""
    if not sys.stderr.isatty():
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
