"""Search over training configurations with the projection oracle (paper Sec. 3.2, App. C, G, H).

One ask/tell interface (:mod:`searchers.base`) behind which sit the seed planner and cross-axis
proposers (``seed_llm``: :mod:`searchers.seed`, :mod:`searchers.crossaxis`, :mod:`searchers.llm`)
and the baselines (``tpe``, ``gp``, ``random``, ``grid``: :mod:`searchers.baselines`); the space
(:mod:`searchers.space`), memory pre-filter (:mod:`searchers.prefilter`), ledger
(:mod:`searchers.ledger`), experiment specs (:mod:`searchers.experiment`) and the in-process driver
(:mod:`searchers.driver`). Nothing here imports ray (the Tune adapter is raytune_primus.tuner). See docs/search.md.
"""
