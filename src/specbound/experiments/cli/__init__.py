"""Thin command layers of the studies: each module has ``add_arguments(parser)`` and ``run(args)``,
which only parse and validate (before any model loads or measuring starts), call the measurement,
then call the report. :mod:`specbound.cli` registers them as ``analyze`` and ``reproduce yin|pankratov``."""
from __future__ import annotations

from ...errors import SpecboundError

__all__ = ["at_least", "positive_threads"]


def at_least(args, minimum: int, *names: str) -> None:
    """Every option in ``names`` that was given must be an integer >= ``minimum`` (clear error otherwise)."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < minimum:
            flag = "--" + name.replace("_", "-")
            raise SpecboundError(f"{flag} must be >= {minimum}, got {value}")


def positive_threads(args) -> None:
    at_least(args, 1, "threads")
