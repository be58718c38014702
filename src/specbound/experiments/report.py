"""THE reporting layer shared by every study: numbers → markdown → HTML, JSON in and out, figures,
progress bars and output directories. Nothing here measures or computes theory.

* formatting: :func:`fmt`, :func:`pm` and pipe tables (:func:`md_table`);
* :func:`markdown_to_html`: a report's markdown as one HTML page (markdown-it-py);
* JSON: :func:`to_jsonable` (the one converter: dataclasses, NumPy, non-finite → null, int keys →
  strings) and :func:`from_jsonable` (back to the typed results, int keys restored) — they live in
  :mod:`specbound.measure.records` (the journal needs them below the studies) and are re-exported here;
* files: :func:`check_output_dir` (BEFORE measuring), :func:`write_json`, :func:`write_text`
  (atomic), :func:`save_figure`;
* progress: :func:`progress_bar` (rich, on stderr), :class:`Stage` (from :mod:`specbound.measure.records`),
  :func:`note`.
"""
from __future__ import annotations

import functools
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
    """A pipe table: first column left-aligned, the others right-aligned; a ``|`` inside a cell
    (``E[X|T]``) is escaped, so it does not split the cell."""
    def line(cells) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    lines = [line(header), "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    lines += [line(r) for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# markdown → HTML
# ---------------------------------------------------------------------------------------------------
_STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
          "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:3px 8px;"
          "text-align:right}th{background:#eee}code{background:#f4f4f4}")
_MD_LINK = re.compile(r"^(?![a-zA-Z][a-zA-Z0-9+.-]*:|/)([^#?]*)\.md(?=$|[#?])")


@functools.cache
def _report_markdown():
    """CommonMark plus pipe tables, raw HTML off (a ``<tag>`` in a report's text is shown, not run)."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    md.core.ruler.push("specbound_report", _report_tokens)
    image = md.renderer.rules["image"]

    def render_image(tokens, idx, options, env):
        out = image(tokens, idx, options, env)
        if tokens[idx].meta.get("figure"):
            alt = md.renderer.renderInlineAsText(tokens[idx].children or [], options, env)
            out += f"<figcaption>{html.escape(alt)}</figcaption>"
        return out

    md.renderer.rules["image"] = render_image
    return md


def _report_tokens(state) -> None:
    """The reports' conventions on top of CommonMark: a paragraph that is one image becomes a
    ``<figure>`` captioned by the alt text; a relative link to ``x.md`` points at ``x.html`` (the
    report next to it); table cells keep the page's CSS alignment (no inline styles)."""
    tokens = state.tokens
    for k, token in enumerate(tokens):
        if token.type in ("th_open", "td_open"):
            token.attrs.pop("style", None)
        if token.type != "inline" or not token.children:
            continue
        children = token.children
        if (len(children) == 1 and children[0].type == "image" and 0 < k < len(tokens) - 1
                and tokens[k - 1].type == "paragraph_open" and tokens[k + 1].type == "paragraph_close"):
            tokens[k - 1].tag = tokens[k + 1].tag = "figure"
            children[0].meta["figure"] = True
            children[0].attrSet("style", "max-width:100%")
        for child in children:
            if child.type == "link_open":
                child.attrSet("href", _MD_LINK.sub(r"\1.html", str(child.attrGet("href") or "")))


def markdown_to_html(md: str, title: str = "specbound report") -> str:
    """A report's markdown as one HTML page (markdown-it-py: CommonMark + pipe tables; raw HTML is
    escaped). An image alone in its paragraph becomes a captioned figure; ``x.md`` links become
    ``x.html``."""
    body = _report_markdown().render(md)
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n" + body + "</body></html>\n")


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
