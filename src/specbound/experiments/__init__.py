"""Experiments: theory measured against the engine on toy chains and real models.

The measurements themselves (moments, oracle and drafter tree values, positions, target laws, stats,
journals) live one layer down, in :mod:`specbound.measure`, shared with ``specbound advise``.

One measurement module per study returns typed results (dataclasses keyed by the capacity P as an
int); one shared reporting layer turns them into markdown, HTML, JSON and PNGs; the commands that
run them (parse, measure, report) live in :mod:`specbound.cli`.

=====================  ==================================================================
module                 responsibility
=====================  ==================================================================
``analyze``            ``specbound analyze``: one prompt set, (a)–(e), speed-ups, bounds
``pankratov``          ``reproduce pankratov``: synthetic i.i.d. checks, moments table, LLM study
``yin``                ``reproduce yin``: Fig. 2–4 (toy chains, Pareto front)
``yin_table1``         ``reproduce yin``: Table 1 in kind (Decoding-OPT vs -UNO, real pair)
``*_report``           the markdown/HTML/PNG/JSON of each study
``report``             shared formatting, markdown → HTML, JSON in/out, files, progress
``plots``              the figures
``bench``              ``specbound bench`` (specbound vs HF generate / assisted)
``verify_cost``        ``specbound bench --verify-cost``
=====================  ==================================================================
"""
