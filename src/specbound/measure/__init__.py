"""The measurement layer: what both the product command (:mod:`specbound.advise`) and the studies
(:mod:`specbound.experiments`) measure on a model or a pair, one copy each.

It sits below them and above the engine: it may import :mod:`specbound.theory`,
:mod:`specbound.models`, :mod:`specbound.decoding`, :mod:`specbound.assets` and the bottom layer
(:mod:`specbound.errors`, :mod:`specbound.seeds`), never the studies, ``advise`` or the command line
(``tests/test_imports.py`` checks it). A measurement names each unit's random stream by its journal
key and the unit's indices (:func:`specbound.seeds.derive_seed`).

=====================  ==================================================================
module                 responsibility
=====================  ==================================================================
``moments``            μ, μ₂ of a model on its own samples (Pankratov & Alistarh §3.4), as THE
                       moments record :class:`specbound.theory.bounds.MomentEstimate`
``oracle``             positions and contexts to measure at; exact E[X | T*(P)]; oracle tree SD
``drafter_values``     real drafters: exact E[X | drafted tree] (and level widths), τ(P), t(k)
``llm``                cache at a moving context, target laws along a text or over a tree,
                       prompts as token ids, the proxy judge
``stats``              mean/SE, ratio SE, Wilson interval, running means, log-slopes
``journal``            partial results (JSONL) for ``--resume``
``records``            typed records to JSON and back; a progress stage
=====================  ==================================================================
"""
