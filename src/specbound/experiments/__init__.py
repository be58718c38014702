"""Experiments: theory measured against the engine on toy chains and real models.

The measurements themselves (moments, oracle and drafter tree values, positions, target laws, stats,
journals) live one layer down, in :mod:`specbound.measure`, shared with ``specbound advise``. One
module per study returns typed results (dataclasses keyed by the capacity P as an int): ``analyze``,
``pankratov``, ``yin`` (with ``yin_pareto``, ``yin_table1``, run by ``yin_study``), ``bench``,
``batched``, ``contention``, ``verify_cost``; ``*_report`` renders each, ``report`` is the shared
formatting (markdown → HTML, JSON in/out, files, progress) and ``plots`` the figures. The commands that
run them (parse, measure, report) live in :mod:`specbound.cli`. The module table: docs/notes.md.
"""
