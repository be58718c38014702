"""The measurement layer: what both the product command (:mod:`specbound.advise`) and the studies
(:mod:`specbound.experiments`) measure on a model or a pair, one copy each.

It sits below them and above the engine: it may import :mod:`specbound.theory`,
:mod:`specbound.models`, :mod:`specbound.decoding`, :mod:`specbound.assets` and the bottom layer
(:mod:`specbound.errors`, :mod:`specbound.seeds`), never the studies, ``advise`` or the command line
(``tests/test_imports.py`` checks it). A measurement names each unit's random stream by its journal
key and the unit's indices (:func:`specbound.seeds.derive_seed`). Modules: ``moments`` (μ, μ₂ of a model
on its own samples, as THE moments record :class:`specbound.theory.bounds.MomentEstimate`), ``oracle``
(positions and contexts; exact E[X | T*(P)]; oracle tree SD), ``drafter_values`` (real drafters' exact
E[X | drafted tree], τ(P), t(k)), ``batch_passes`` (what B rows cost), ``llm`` (a cache at a moving
context, target laws, prompts as ids, the proxy judge), ``stats``, ``journal`` (partial results for
``--resume``) and ``records`` (typed records to JSON and back; a progress stage).
"""
