"""Typed measurement records out and back in (JSON), and a progress stage that works without a display.

Results and journal units are dataclasses; :func:`to_jsonable` writes them, :func:`from_jsonable`
reads them back. Old files keep loading: unknown keys are ignored, missing fields defaulted, and a
record whose shape changed converts its older shape on read (a classmethod ``_upgrade_json(data) ->
data`` that leaves the current shape alone; e.g. ``experiments.pankratov.MomentRow``).
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path

import numpy as np

from ..errors import SpecboundError

__all__ = ["Stage", "from_jsonable", "not_written", "omitted_if_none", "to_jsonable"]


def omitted_if_none(default=None):
    """A dataclass field left out of the JSON while it is None (absent = not measured)."""
    return dataclasses.field(default=default, metadata={"omit_if_none": True})


def not_written(default=None):
    """A dataclass field that is never written to the JSON (raw data a report draws from, such as
    Monte Carlo samples); read back it keeps its default."""
    return dataclasses.field(default=default, repr=False, compare=False, metadata={"not_written": True})


def to_jsonable(obj):
    """JSON-safe copy of a result: dataclasses → dicts of their fields (fields marked
    :func:`omitted_if_none` are left out while None), dict keys → strings, tuples → lists, NumPy →
    Python, NaN/±inf → None, paths → strings."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.metadata.get("not_written") or (value is None and f.metadata.get("omit_if_none")):
                continue
            out[f.name] = to_jsonable(value)
        return out
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        return value if math.isfinite(value) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _union_args(tp):
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(tp)
    return None


def from_jsonable(tp, data, where: str = "result"):
    """Rebuild a value of type ``tp`` (a dataclass, ``dict[int, X]``, ``list[X]``, ``X | None``, …)
    from :func:`to_jsonable` output. Unknown keys are ignored and missing fields keep their
    defaults, so results written by older versions still load; a wrong shape raises
    :class:`SpecboundError` naming where."""
    if tp is typing.Any or tp is object:
        return data
    union = _union_args(tp)
    if union is not None:
        if data is None and type(None) in union:
            return None
        options = [t for t in union if t is not type(None)]
        errors = []
        for option in options:
            try:
                return from_jsonable(option, data, where)
            except (SpecboundError, TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise SpecboundError(f"{where}: {data!r:.80} matches none of {options} ({'; '.join(errors)})")
    if dataclasses.is_dataclass(tp):
        upgrade = getattr(tp, "_upgrade_json", None)
        if upgrade is not None and isinstance(data, dict):
            data = upgrade(data)
        if not isinstance(data, dict):
            raise SpecboundError(f"{where}: expected an object for {tp.__name__}, got {type(data).__name__}")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if not f.init:
                continue
            if f.name in data:
                kwargs[f.name] = from_jsonable(hints[f.name], data[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SpecboundError(f"{where}: missing field {f.name!r} of {tp.__name__}")
        return tp(**kwargs)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict:
        if not isinstance(data, dict):
            raise SpecboundError(f"{where}: expected an object, got {type(data).__name__}")
        key_type, value_type = args or (str, typing.Any)
        out = {}
        for k, v in data.items():
            try:
                key = key_type(k)
            except (TypeError, ValueError):
                raise SpecboundError(f"{where}: key {k!r} is not a {key_type.__name__}") from None
            out[key] = from_jsonable(value_type, v, f"{where}[{k}]")
        return out
    if origin in (list, tuple):
        if not isinstance(data, list):
            raise SpecboundError(f"{where}: expected a list, got {type(data).__name__}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            return tuple(from_jsonable(t, v, f"{where}[{i}]") for i, (t, v) in enumerate(zip(args, data)))
        item = args[0] if args else typing.Any
        values = [from_jsonable(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
        return tuple(values) if origin is tuple else values
    if tp is float:
        if data is None:
            return float("nan")
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise SpecboundError(f"{where}: expected a number, got {data!r:.40}")
        return float(data)
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise SpecboundError(f"{where}: expected an integer, got {data!r:.40}")
        return data
    if tp is bool:
        if not isinstance(data, bool):
            raise SpecboundError(f"{where}: expected true/false, got {data!r:.40}")
        return data
    if tp is str:
        if not isinstance(data, str):
            raise SpecboundError(f"{where}: expected a string, got {data!r:.40}")
        return data
    return data


class Stage:
    """One task of a progress display; works without one (``progress=None``)."""

    def __init__(self, progress, description: str, total: int):
        self.progress = progress
        self.task = progress.add_task(description, total=total) if progress is not None else None

    def advance(self, n: int = 1) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, n)
