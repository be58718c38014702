"""Where the commands print their tables: a rich console that suits the stream it writes to.

On a terminal the console is rich's own (colours, the terminal's width). Written to a file or a pipe
(``specbound assets list > models.txt``, ``specbound theory | less``), rich would still wrap every
table to 80 columns and break names and paths into narrow columns; there the console gets no width
limit, so each table row and each printed line stays one line of text (rich already leaves the
colours out when the stream is not a terminal). Every command that prints a rich ``Table`` takes its
console from :func:`console`.
"""
from __future__ import annotations

__all__ = ["UNLIMITED_WIDTH", "console"]

#: The width of a console that writes to a file or a pipe: wider than any row a command prints, so
#: nothing wraps; a table still takes only the width its cells need.
UNLIMITED_WIDTH = 100_000


def console(*, stderr: bool = False, quiet: bool = False):
    """A :class:`rich.console.Console` on stdout (or stderr): rich's defaults on a terminal, no width
    limit (no wrapping, no folded cells) when the stream is a file or a pipe.

    The stream is checked when the console is made (``sys.stdout`` / ``sys.stderr`` as they are then),
    so make it where the command prints, not at import.
    """
    from rich.console import Console

    out = Console(stderr=stderr, quiet=quiet)
    if out.is_terminal:
        return out
    return Console(stderr=stderr, quiet=quiet, width=UNLIMITED_WIDTH)
