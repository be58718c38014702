"""Partial results of a long measurement, one JSON line per finished unit, for ``--resume``.

A study asks :meth:`PartialResults.unit` for each unit of work (one prompt's sample, one oracle
position, one (prompt, sample) pair, …) under a stable key; the unit is measured only if the file
does not hold it yet, and is appended (flushed and fsynced) as soon as it is done, so an
interrupted run loses at most the unit in flight. The first line records a fingerprint of the
configuration and the seed derivation (:mod:`specbound.seeds`): resuming with different settings, or a
journal whose units drew their random streams another way (format 1, before ``derive_seed``), is
refused. Lines that do not parse or do not decode into the unit's type are dropped with a warning and
measured again.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from ..errors import SpecboundError
from ..seeds import SEED_SCHEME
from .records import from_jsonable, to_jsonable

__all__ = ["PARTIAL_NAME", "PartialResults"]

PARTIAL_NAME = "partial.jsonl"
_FORMAT = 2          # 2: units seeded by specbound.seeds.derive_seed; 1: by inline seed arithmetic


class PartialResults:
    """Append-only JSONL journal ``path`` of finished units for one run with ``fingerprint``.

    ``resume=False`` starts a fresh journal (an existing one is replaced); ``resume=True`` keeps the
    valid units of an existing journal made with the same fingerprint. ``path=None`` keeps nothing
    (every unit is measured, nothing written).
    """

    def __init__(self, path, fingerprint: dict, resume: bool = False, warn=None):
        self.path = None if path is None else Path(path)
        self.fingerprint = to_jsonable(fingerprint)
        self.warn = warn or (lambda message: warnings.warn(message, stacklevel=3))
        self.units: dict[str, object] = {}
        self.reused = 0
        if self.path is None:
            return
        if resume and self.path.exists():
            self._load()
        else:
            self._rewrite()

    # ------------------------------------------------------------------ reading
    def _load(self) -> None:
        lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        header = None
        if lines:
            try:
                header = json.loads(lines[0])
            except ValueError:
                header = None
        if not isinstance(header, dict) or not isinstance(header.get("specbound_partial"), int):
            raise SpecboundError(f"{self.path} is not a specbound partial-results file (bad first line); "
                                 "remove it or run without --resume")
        if header["specbound_partial"] != _FORMAT or header.get("seeds") != SEED_SCHEME:
            seeds = header.get("seeds", "by inline arithmetic")
            raise SpecboundError(f"{self.path} was written by another version of specbound (partial-results format "
                                 f"{header['specbound_partial']}, seeds {seeds}): its units drew other random "
                                 "streams, so they cannot be mixed with new ones; run without --resume to start afresh")
        if header.get("fingerprint") != self.fingerprint:
            raise SpecboundError(f"{self.path} was written with other settings ({header.get('fingerprint')!r:.200}); "
                                 "rerun with the same options, or without --resume to start afresh")
        bad = 0
        for number, line in enumerate(lines[1:], start=2):
            try:
                entry = json.loads(line)
                if not (isinstance(entry, dict) and isinstance(entry.get("key"), str) and "data" in entry):
                    raise ValueError("expected {\"key\": ..., \"data\": ...}")
            except ValueError as exc:
                bad += 1
                self.warn(f"{self.path}:{number}: dropped an unreadable partial result ({exc})")
                continue
            self.units[entry["key"]] = entry["data"]
        if bad:
            self._rewrite()          # appends must not follow a torn line

    def _rewrite(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"specbound_partial": _FORMAT, "seeds": SEED_SCHEME,
                                 "fingerprint": self.fingerprint}) + "\n")
            for key, data in self.units.items():
                fh.write(json.dumps({"key": key, "data": data}) + "\n")
        os.replace(tmp, self.path)

    # ------------------------------------------------------------------ units
    def __contains__(self, key: str) -> bool:
        return key in self.units

    def __len__(self) -> int:
        return len(self.units)

    def put(self, key: str, value) -> None:
        data = to_jsonable(value)
        self.units[key] = data
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"key": key, "data": data}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def unit(self, key: str, kind, measure):
        """The unit ``key`` of type ``kind``: from the journal if it holds a valid one, else
        ``measure()`` (then journalled)."""
        if key in self.units:
            try:
                value = from_jsonable(kind, self.units[key], key)
                self.reused += 1
                return value
            except SpecboundError as exc:
                self.warn(f"{self.path}: dropped partial result {key!r} ({exc}); measuring it again")
        value = measure()
        self.put(key, value)
        return value

    def discard(self) -> None:
        """Remove the journal (after the final results are written)."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def no_journal() -> PartialResults:
    """A journal that keeps nothing (library calls without ``--resume`` support)."""
    return PartialResults(None, {})
