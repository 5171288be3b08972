"""A step-time model calibrated on the oracle's breakdowns: where an iteration's time goes, carried to
configurations no trial has measured.

Every scored trial comes back with its time breakdown (``TrialResult.breakdown``: compute, recompute, pipeline
bubble, host stalls, optimizer, and per communication kind the total and the exposed part). A breakdown says more
than the throughput: on a step spent 80 % in FSDP all-gathers, turning FSDP off is worth up to 5x, whatever else
the ledger holds. :class:`StepModel` carries each measured term to other points of the space by how that term
scales with the parallel layout (first-order facts of data, tensor, context, expert and pipeline parallelism, the
ones a person reading the breakdown reasons with), calibrated on the measured terms themselves:

============  ==================================================================================================
term          carried by (per GPU and step; ``m`` micro-batches per pipeline, ``L/pp`` layers per stage)
============  ==================================================================================================
compute       the work per GPU is fixed by GBS and the GPU count: the measured compute of the nearest point
              with the same number format (else the format's peak ratio on the part, :data:`GEMM_SHARE` of it)
recompute     compute x the measured share of that recompute mode (prior :data:`RECOMPUTE_PRIOR`)
bubble        (pp - 1) / (m x vpp) x the stage time (compute, recompute, host stalls, exposed tp/cp/ep) x the
              measured factor of that schedule (prior :data:`BUBBLE_PRIOR`; another schedule's factor carried
              by the ratio of the priors, except from a zero-bubble schedule to a 1F1B one: the prior)
host stalls   per layer pass (m x L/pp, twice with full recompute), as measured at the nearest point with the
              same dispatcher settings
tp / cp       (tp - 1) and tp x (cp - 1) activation volumes over the group's links
ep_a2a        (ep - 1) / ep of the routed tokens (top-k x hidden) over the group's links
pp_p2p        m x vpp activations per stage boundary
fsdp_ag/_rs   m x the stage's parameters (dense / (tp pp), experts / (ep etp pp)) over the sharding group
dp/expert     the stage's dense / expert gradients over the data-parallel group, once per step
============  ==================================================================================================

"Over the group's links": a group of ``g`` ranks ``stride`` apart keeps ``(inside - 1) / (g - 1)`` of its traffic
inside a node (scale-up bandwidth) and sends the rest over the NICs (scale-out bandwidth), from the cluster's
profile. Each communication total is ``c x that time`` with ``c`` calibrated on the nearest measured point that has
the term and the same inside/across-node regime, and its exposed part is ``total - w x (compute + recompute)``
with the overlap ``w`` measured there. A term no trial has shown yet is not invented: the model predicts what the
breakdowns let it attribute. Nearest means sharing the settings that change the term first (:data:`TERM_KEYS`:
the number format for compute, the dispatcher for the all-to-all, ...), then the most other axis values.

The model ranks candidates no trial has measured (layout jumps, moves that need a memory repair); it never scores
a trial. Model and cluster facts come from the run's card and profile; nothing here knows an experiment or a model
by name. Predictions are vectorised over a block of enumerated points (``SearchSpace.points`` rows).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from searchers.space import SearchSpace

RECOMPUTE_PRIOR: dict[str, float] = {"none": 0.0, "selective": 0.05, "full": 1.0 / 3.0}
"""Recompute time as a share of compute until one is measured: full recompute replays the forward (a third of
forward + backward); selective replays the attention core only (Korthikanti et al. 2022)."""
BUBBLE_PRIOR: dict[str, float] = {"1f1b": 1.0, "interleaved": 1.0, "zero_bubble": 0.3, "zbv": 0.3}
"""Bubble as a multiple of (pp - 1) / (m x vpp) of the busy time until the schedule is measured (Narayanan et al.
2021 for 1F1B and interleaving; the zero-bubble schedules fill most of it, Qi et al. 2023)."""
GEMM_SHARE = 0.7
"""Share of compute in GEMMs that a lower number format speeds up by the part's peak ratio, until the format is
measured (an estimate: attention, norms and element-wise ops keep their time)."""
FORMAT_DTYPE: dict[str, str] = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "nvfp4": "fp4", "mxfp4": "fp4"}
"""Training number format -> the peak of the hardware profile it runs at."""
TERM_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "compute_s": (("precision", "fp8_recipe", "fused_grouped_mlp", "moe_router_fusion"), ()),
    "host_sync_s": (("moe_sync_free", "moe_a2a_backend", "cuda_graph_impl", "cuda_graph_scope", "fused_grouped_mlp",
                     "moe_router_fusion"), ("mbs", "tp")),
    "ep_a2a": (("moe_a2a_backend", "moe_a2a_overlap", "moe_sync_free", "moe_shared_expert_overlap"), ()),
    "fsdp_ag": (("overlap_param_gather", "fp8_param_gather"), ()),
    "fsdp_rs": (("overlap_grad_reduce",), ()),
    "dp_grad": (("overlap_grad_reduce", "use_distributed_optimizer"), ()),
    "dp_param_gather": (("overlap_param_gather", "fp8_param_gather"), ()),
    "expert_grad": (("overlap_grad_reduce", "use_distributed_optimizer"), ()),
    "tp": (("tp_comm_overlap", "sequence_parallel"), ()),
}
"""Settings a measured point must share to calibrate a term for another point: (first, then) before the other axis
values (the number format decides compute more than the micro-batch size does)."""
OVERLAP_PRIOR: dict[str, float] = {"pp_p2p": 1.0, "fsdp_ag": 1.0, "fsdp_rs": 1.0, "dp_grad": 1.0,
                                   "dp_param_gather": 1.0, "expert_grad": 1.0}
"""Compute (as a multiple of compute + recompute) a communication kind can hide under until a trial measures it:
the data-parallel, sharding and pipeline transfers are issued to overlap (bucketed, prefetched, asynchronous);
the tensor, context and expert collectives sit on the critical path (0: fully exposed)."""
SHARE_LIMITED = 0.15
"""Largest exposed share read as the overlap's ceiling rather than as compute running out."""
EXPOSED_SHARE = 0.05
"""Share of a transfer left exposed however much compute there is to hide it under, when the measurements show only
the capacity limit (an estimate: the first gather of a pass and the last reduction wait for nothing to overlap)."""
COMPUTE_SHAPE: tuple[str, ...] = ("tp", "ep", "mbs", "cp")
"""Settings that change the GEMM shapes, so the kernels' efficiency: the ledger's measurements give compute's
elasticity to each (:meth:`StepModel._compute_elasticities`)."""
COMPUTE_RIDGE = 1.0
"""Ridge penalty of that fit (per doubling, in log compute): a setting measured at two values moves it, a hint does
not."""
NODE_LEVEL_DISPATCH: tuple[str, ...] = ("deepep", "hybridep")
"""MoE dispatchers that send a token once per destination node (DeepEP's normal kernels, NVIDIA's HybridEP)."""
POST_FLUSH: tuple[str, ...] = ("dp_grad", "dp_param_gather", "expert_grad")
"""Transfers once per step at its edges (the last micro-batch's gradients, the next step's parameters): they hide
under one micro-batch's compute at most."""
STAGE_COMM: tuple[str, ...] = ("tp", "cp", "ep_a2a")
"""Communication inside the layers: what is left exposed lengthens every micro-batch's stage time, so the bubble."""
COMM_KINDS: tuple[str, ...] = ("tp", "cp", "ep_a2a", "pp_p2p", "fsdp_ag", "fsdp_rs", "dp_grad", "dp_param_gather",
                               "expert_grad")
"""Communication kinds of the oracle's breakdown that the model carries (others are taken as measured)."""
_NUMERIC = ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs", "gbs", "seq_len")


class StepModel:
    """Iteration time of points of ``space``, from the measured breakdowns of others (see the module doc)."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        run = space.baseline
        m, hw = run.model, run.cluster.hardware
        self.gpus = run.cluster.num_gpus
        self.node = max(1, hw.gpus_per_node)
        eff = hw.efficiency
        self.bw_up = hw.scale_up_bandwidth_bytes_per_s * eff.scale_up_bus
        self.bw_out = hw.scale_out_bandwidth_bytes_per_s * eff.scale_out_bus
        kinds = m.layer_kinds
        self.layers = len(kinds)
        self.moe_layers = sum(1 for k in kinds if k == "moe")
        self.hidden = m.hidden_size
        self.topk = m.moe_topk if m.is_moe else 0
        self.kv_width = m.kv_width
        expert = self.moe_layers * m.num_experts * m.mlp_params(m.expert_ffn) if m.is_moe else 0
        self.expert_params = float(expert)
        self.dense_params = float(m.total_params() - expert)
        self.peaks = {f: hw.peak_flops_per_s.get(d) for f, d in FORMAT_DTYPE.items()}
        self.axes = space.axes
        self._col = {a: i for i, a in enumerate(self.axes)}
        self._code = {a: {v: i for i, v in enumerate(space.values[a])} for a in self.axes}
        self._num = {a: np.array([float(v) if isinstance(v, (int, float)) and v is not None else np.nan
                                  for v in space.values[a]]) for a in self.axes}
        self._str = {a: np.array([str(v) for v in space.values[a]], dtype=object) for a in self.axes}
        self.codes = np.zeros((0, len(self.axes)), dtype=np.int16)
        """Measured points (axis value codes), one row per scored configuration."""
        self.terms: list[dict[str, float]] = []
        """Their breakdowns."""
        self._cols: dict[str, np.ndarray] = {}
        self._cache: dict[Any, tuple[int, np.ndarray, np.ndarray]] = {}
        """Incremental nearest-point lookups per (block, term): rows measured so far, distances, indices."""
        self._statics: dict[Any, Any] = {}
        self._imb: dict[tuple[float, ...], float] = {}

    # ------------------------------------------------------------------ input
    def encode(self, point: Mapping[str, Any]) -> np.ndarray | None:
        """A point's axis value codes (None when a value is outside the space)."""
        try:
            return np.array([self._code[a][point[a]] for a in self.axes], dtype=np.int16)
        except (KeyError, TypeError):
            return None

    def observe(self, point: Mapping[str, Any], breakdown: Mapping[str, float] | None) -> None:
        """Record a scored point of the space (axis values) and its breakdown."""
        row = self.encode(point) if breakdown else None
        if row is None:
            return
        self.codes = np.vstack([self.codes, row[None, :]])
        self.terms.append(dict(breakdown))  # type: ignore[arg-type]

    @property
    def ready(self) -> bool:
        return bool(self.terms)

    # ------------------------------------------------------------------ fields of a block of points
    def _field(self, codes: np.ndarray, name: str) -> np.ndarray:
        if name in self._col:
            return self._num[name][codes[:, self._col[name]]]
        v = getattr(self.space.baseline.training, name)
        return np.full(len(codes), float(v) if isinstance(v, (int, float)) and v is not None else np.nan)

    def _label(self, codes: np.ndarray, name: str) -> np.ndarray:
        if name in self._col:
            return self._str[name][codes[:, self._col[name]]]
        return np.full(len(codes), str(getattr(self.space.baseline.training, name)), dtype=object)

    def _shape(self, codes: np.ndarray) -> dict[str, np.ndarray]:
        f = {n: self._field(codes, n) for n in _NUMERIC}
        for n in ("vpp", "ep", "etp"):
            f[n] = np.nan_to_num(f[n], nan=1.0)
        f["dp"] = np.maximum(1.0, np.floor(self.gpus / (f["tp"] * f["cp"] * f["pp"])))
        f["micro"] = np.maximum(1.0, f["gbs"] / (f["dp"] * f["mbs"]))
        for n in ("recompute", "pp_schedule", "precision", "fsdp", "use_distributed_optimizer", "moe_a2a_backend"):
            f[n] = self._label(codes, n)
        return f

    # ------------------------------------------------------------------ physical scale of each term
    def _span_time(self, volume: np.ndarray, group: np.ndarray, stride: np.ndarray,
                   exchange: bool = False, per_node: np.ndarray | None = None) -> np.ndarray:
        """Seconds to move ``volume`` bytes per GPU within groups of ``group`` ranks ``stride`` apart, ``inside`` of
        them in each node. A collective (gather, scatter, reduction) runs hierarchically: its share across nodes goes
        over the ``inside`` ranks' NICs in parallel, 1/inside of it each (NCCL/RCCL's rail-aligned rings); an
        ``exchange`` (all-to-all) sends each peer its own share, the part for other nodes over the rank's one NIC;
        ``per_node`` (0-1 per point) scales that part where a token bound for several experts of one node crosses the
        network once (DeepEP's node-level dispatch)."""
        g = np.maximum(group, 1.0)
        inside = np.where(g * stride <= self.node, g, np.maximum(1.0, np.floor(self.node / np.maximum(stride, 1.0))))
        inside = np.minimum(inside, g)
        nodes = np.maximum(1.0, g / inside)
        if exchange:
            up = (inside - 1) / g
            out = (g - inside) / g * (1.0 if per_node is None else per_node)
        else:
            up = (inside - 1) / inside
            out = (nodes - 1) / nodes / inside
        t = volume * (up / self.bw_up + out / self.bw_out)
        return np.where(g > 1, t, 0.0)

    def _across(self, kind: str, f: Mapping[str, np.ndarray]) -> np.ndarray:
        """Whether a kind's group spans nodes (calibrations are taken within the same regime)."""
        group, stride = self._group(kind, f)
        return (group * stride > self.node) & (group > 1)

    def _group(self, kind: str, f: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        tp, cp, ep, etp = f["tp"], f["cp"], f["ep"], f["etp"]
        edp = np.maximum(1.0, np.floor(f["dp"] * cp * tp / (ep * etp)))
        if kind == "tp":
            return tp, np.ones_like(tp)
        if kind == "cp":
            return cp, tp
        if kind == "ep_a2a":
            return ep, etp  # Megatron folds the expert groups over the tensor/data ranks: consecutive ranks
        if kind == "pp_p2p":
            return f["pp"], self.gpus / f["pp"]
        if kind == "expert_grad":
            return edp, tp * cp * ep
        return f["dp"] * cp, tp  # fsdp / dp: the data-parallel (and context) group

    def driver(self, kind: str, f: Mapping[str, np.ndarray]) -> np.ndarray:
        """Physical scale of a communication kind (seconds at the links' bandwidth, before calibration)."""
        tp, cp, pp, vpp, ep = f["tp"], f["cp"], f["pp"], f["vpp"], f["ep"]
        mbs, seq, micro = f["mbs"], f["seq_len"], f["micro"]
        replay = np.where(f["recompute"] == "full", 1.5, 1.0)
        act = mbs * seq / cp * self.hidden * 2.0
        group, stride = self._group(kind, f)
        if kind == "tp":
            vol = micro * self.layers / pp * 8 * act * replay
        elif kind == "cp":
            vol = micro * self.layers / pp * 3 * (mbs * seq * self.kv_width * 2.0) * replay
        elif kind == "ep_a2a":
            tokens = mbs * seq / (cp * tp)
            vol = micro * self.moe_layers / pp * 4 * tokens * self.topk * self.hidden * 2.0 * replay
            # DeepEP-style dispatchers send a token once per destination node, then fan out inside it: the share of
            # the top-k copies that cross the network is E[distinct nodes among k] / k (uniform routing)
            inside = np.minimum(np.maximum(1.0, np.floor(self.node / np.maximum(stride, 1.0))), np.maximum(group, 1.0))
            nodes = np.maximum(1.0, group / inside)
            k = max(1, self.topk)
            dedup = np.where(nodes > 1, nodes * (1.0 - (1.0 - 1.0 / nodes) ** k) / k, 1.0)
            node_level = np.isin(f["moe_a2a_backend"], NODE_LEVEL_DISPATCH)
            return self._span_time(vol, group, stride, exchange=True, per_node=np.where(node_level, dedup, 1.0))
        elif kind == "pp_p2p":
            return np.where(pp > 1, micro * vpp * 2 * act / tp / self.bw_out, 0.0)
        else:
            dense = self.dense_params / (tp * pp)
            expert = self.expert_params / (ep * f["etp"] * pp)
            if kind in ("fsdp_ag", "fsdp_rs"):
                # parameters gathered for the forward and the backward of every micro-batch; gradients
                # reduce-scattered once per step (accumulated over the micro-batches)
                per = 2.0 * micro if kind == "fsdp_ag" else 1.0
                dp_g, dp_s = self._group("dp_grad", f)
                ex_g, ex_s = self._group("expert_grad", f)
                return (self._span_time(per * dense * 2.0, dp_g, dp_s)
                        + self._span_time(per * expert * 2.0, ex_g, ex_s))
            # gradients reduce-scattered with the distributed optimizer, all-reduced (twice the traffic) without it;
            # its parameter all-gather moves what the reduce-scatter did
            allreduce = np.where((f["use_distributed_optimizer"] == "True") | (kind == "dp_param_gather"), 1.0, 2.0)
            vol = (expert if kind == "expert_grad" else dense) * 4.0 * allreduce
        return self._span_time(vol, group, stride)

    # ------------------------------------------------------------------ calibration lookups
    def _nearest(self, codes: np.ndarray, keys: tuple[Sequence[str], Sequence[str]], rows: np.ndarray,
                 extra: tuple[np.ndarray, np.ndarray] | None = None, cache: Any = None,
                 scale: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """For each candidate, the index (into the measured rows ``rows``) of the nearest one: fewest
        mismatches on the first tier of ``keys``, then on the second tier (numeric settings: in doublings), then
        (``scale``: candidate and measured log drivers) the fewest e-folds the term must be carried plus one for a
        mismatch on ``extra`` (candidate and measured labels, one per measured row: the links' regime), then on all
        axes; ties go to the earlier measurement. With ``cache`` (a key naming this block and lookup) only the
        rows measured since the last call are compared, so a search that re-ranks the whole space after every
        trial pays for each measurement once."""
        first = [self._col[k] for k in keys[0] if k in self._col]
        second = [self._col[k] for k in keys[1] if k in self._col and k not in _NUMERIC]
        steps = [(self._col[k], np.log2(np.maximum(self._num[k], 1e-9))) for k in keys[1]
                 if k in self._col and k in _NUMERIC]
        state = self._cache.get(cache) if cache is not None else None
        if state is None or len(state[1]) != len(codes):
            state = (0, np.full(len(codes), np.inf), np.zeros(len(codes), np.int64))
        done, best_d, best_i = state
        for r in rows[rows >= done] if cache is not None else rows:
            diff = codes != self.codes[r][None, :]
            d = diff.sum(axis=1).astype(np.float64)
            if first:
                d += 10000 * diff[:, first].sum(axis=1)
            if second:
                d += 100 * diff[:, second].sum(axis=1)
            for col, logv in steps:  # a numeric setting: the fewest doublings away
                d += 100 * np.abs(logv[codes[:, col]] - logv[self.codes[r, col]])
            if extra is not None:
                d += 10 * (extra[0] != extra[1][r])
            if scale is not None:
                d += 10 * np.abs(scale[0] - scale[1][r])
            better = d < best_d
            best_d = np.where(better, d, best_d)
            best_i = np.where(better, r, best_i)
        if cache is not None:
            self._cache[cache] = (len(self.terms), best_d, best_i)
        return best_i

    def _static(self, block: Any, what: Any, make: Any) -> Any:
        """What depends on a block's points only (their shapes, drivers), computed once per named block."""
        if block is None:
            return make()
        key = (block, what)
        if key not in self._statics:
            self._statics[key] = make()
        return self._statics[key]

    def _optimizer_work(self, f: Mapping[str, np.ndarray]) -> np.ndarray:
        sharded = (f["fsdp"] == "True") | (f["use_distributed_optimizer"] == "True")
        dense = self.dense_params / (f["tp"] * f["pp"])
        expert = self.expert_params / (f["ep"] * f["etp"] * f["pp"])
        dp_g = f["dp"] * f["cp"]
        edp = np.maximum(1.0, np.floor(dp_g * f["tp"] / (f["ep"] * f["etp"])))
        return np.where(sharded, dense / dp_g + expert / edp, dense + expert)

    def _compute_x(self, f: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.stack([np.log2(np.maximum(f[k], 1.0)) for k in COMPUTE_SHAPE], axis=1)

    def _compute_elasticities(self, mf: Mapping[str, np.ndarray], mimb: np.ndarray) -> np.ndarray | None:
        """Ridge fit of log(compute / imbalance) on log2 of :data:`COMPUTE_SHAPE` within each number format (its
        level taken out): the compute change per doubling of each setting; None before three measurements."""
        n = len(self.terms)
        if n < 3:
            return None
        y = np.log(np.maximum(self._value("compute_s", np.arange(n)), 1e-12)) - np.log(mimb)
        x = self._compute_x(mf)
        groups = mf["precision"].astype(str) + "/" + self._label(self.codes, "fp8_recipe").astype(str)
        for g in set(groups.tolist()):  # centre each format group: the format's level is not a shape effect
            sel = groups == g
            y[sel] -= y[sel].mean()
            x[sel] -= x[sel].mean(axis=0)
        return np.linalg.solve(x.T @ x + COMPUTE_RIDGE * np.eye(x.shape[1]), x.T @ y)

    def _imbalance(self, f: Mapping[str, np.ndarray]) -> np.ndarray:
        """Work of the busiest pipeline rank over the mean rank's, per point (1 without a pipeline)."""
        out = np.ones(len(f["pp"]))
        keys = np.stack([f["pp"], f["vpp"], (f["pp_schedule"] == "zbv").astype(float)], axis=1) \
            if len(f["pp"]) else np.zeros((0, 3))
        for key in {tuple(k) for k in keys.tolist()}:
            pp, vpp = int(key[0]), int(key[1])
            if pp <= 1:
                continue
            if key not in self._imb:
                self._imb[key] = self._rank_imbalance(pp, vpp, bool(key[2]))
            out[np.all(keys == np.array(key), axis=1)] = self._imb[key]
        return out

    def _rank_imbalance(self, pp: int, vpp: int, v_shape: bool) -> float:
        from oracle.layout import assignment_of
        from oracle.pipeline_layout import card_weights
        try:
            point = {**self.space.point_of(self.space.baseline), "pp": pp, "vpp": vpp}
            a = assignment_of(self.space.run_of(point))
            w = card_weights(self.space.baseline.model)
            loads = [sum(w.stage_load(st) for st in row) for row in a.by_rank(v_shape)]
        except Exception:  # noqa: BLE001 - a layout the oracle cannot assign: no imbalance known
            return 1.0
        mean = sum(loads) / len(loads)
        return max(loads) / mean if mean > 0 else 1.0

    def _measured(self, name: str) -> np.ndarray:
        return np.array([i for i, t in enumerate(self.terms) if t.get(name, 0.0) > 0.0], dtype=np.int64)

    def _value(self, name: str, idx: np.ndarray) -> np.ndarray:
        col = self._cols.get(name)
        if col is None or len(col) != len(self.terms):
            col = self._cols[name] = np.array([t.get(name, 0.0) for t in self.terms])
        return col[idx]

    # ------------------------------------------------------------------ prediction
    def predict(self, codes: np.ndarray, block: Any = None) -> dict[str, np.ndarray]:
        """Predicted seconds per term at each point of a block (rows of axis value codes; exposed parts for the
        communication kinds; ``total`` is their sum). ``block``: a name for a block predicted again after more
        measurements (the same rows each time): its nearest-point lookups are updated, not redone. Call only when
        :attr:`ready`."""
        n = len(codes)
        f = self._static(block, "shape", lambda: self._shape(codes))
        mf = self._shape(self.codes)
        every = np.arange(len(self.terms))
        out: dict[str, np.ndarray] = {}
        # compute: the nearest point with the same number format; a format never measured scales by its peak
        near = self._nearest(codes, TERM_KEYS["compute_s"], every, cache=block and (block, "compute_s"))
        compute = self._value("compute_s", near)
        fmt = f["precision"]
        ref_fmt = mf["precision"][near]
        measured_fmts = set(mf["precision"].tolist())
        scale = np.ones(n)
        for p in set(fmt.tolist()) - measured_fmts:
            for q in set(ref_fmt.tolist()):
                sel = (fmt == p) & (ref_fmt == q)
                if sel.any() and self.peaks.get(p) and self.peaks.get(q):
                    scale[sel] = (1.0 - GEMM_SHARE) + GEMM_SHARE * self.peaks[q] / self.peaks[p]
        # the critical pipeline rank carries its share of the layers plus the output layer and loss
        # (oracle.pipeline_layout.card_weights: per-token GEMM work of each part of the model)
        imb = self._static(block, "imbalance", lambda: self._imbalance(f))
        mimb = self._imbalance(mf)
        compute = compute * scale * imb / mimb[near]
        # what the ledger says the shape settings do to compute (GEMM sizes: tp, ep, micro-batch, cp), carried from
        # the reference to each point; with few trials the ridge keeps it near nothing
        w = self._compute_elasticities(mf, mimb)
        if w is not None:
            x = self._static(block, "compute_x", lambda: self._compute_x(f))
            compute = compute * np.exp((x - self._compute_x(mf)[near]) @ w)
        out["compute_s"] = compute
        # recompute: share of compute per mode (measured where the mode was)
        rc = f["recompute"]
        share = np.array([RECOMPUTE_PRIOR.get(r, 0.0) for r in rc])
        for mode in set(rc.tolist()) - {"none"}:
            rows = [i for i in every if mf["recompute"][i] == mode and self.terms[i].get("compute_s")]
            if rows:
                share[rc == mode] = float(np.median([self.terms[i].get("recompute_s", 0.0) / self.terms[i]["compute_s"]
                                                     for i in rows]))
        out["recompute_s"] = compute * share
        busy = compute + out["recompute_s"]
        # host stalls: per layer pass, as at the nearest point with the same dispatcher settings
        passes = f["micro"] * self.layers / f["pp"] * np.where(rc == "full", 2.0, 1.0)
        mpasses = mf["micro"] * self.layers / mf["pp"] * np.where(mf["recompute"] == "full", 2.0, 1.0)
        near_h = self._nearest(codes, TERM_KEYS["host_sync_s"], every, cache=block and (block, "host_sync_s"))
        out["host_sync_s"] = self._value("host_sync_s", near_h) / mpasses[near_h] * passes
        # optimizer step: over the parameters a GPU updates (its stage's share, divided over the data-parallel
        # ranks when the optimizer state is sharded: distributed optimizer or FSDP)
        owork = self._static(block, "optimizer_work", lambda: self._optimizer_work(f))
        out["optimizer_s"] = self._value("optimizer_s", near) * owork / self._optimizer_work(mf)[near]
        out["other_s"] = self._value("other_s", near)
        for kind in COMM_KINDS:
            out[kind] = self._comm(kind, codes, f, mf, busy, block)
        # bubble: (pp - 1) / (m vpp) of a micro-batch's stage time (compute, recompute, host stalls and the exposed
        # collectives inside the layers), by the factor measured at the nearest pipelined point (same schedule
        # first; another schedule's factor is carried by the ratio of the two priors, but a zero-bubble schedule's
        # is not carried to a 1F1B-family one: it says how much of the bubble the deferred weight gradients filled,
        # which a 1F1B schedule does not do, so such a point gets its prior (a ZBV point that filled little, factor
        # 0.87 against its prior 0.3 with MoE host stalls in the stage, gave interleaving a factor of 2.9))
        stage = busy + out["host_sync_s"] + sum(out[k] for k in STAGE_COMM)
        sched = f["pp_schedule"]
        prior = np.array([BUBBLE_PRIOR.get(x, 1.0) for x in sched])
        factor = prior
        piped = np.array([i for i in every if mf["pp"][i] > 1], dtype=np.int64)
        if len(piped):
            mbase = (mf["pp"] - 1) / (mf["micro"] * mf["vpp"])
            mstage = sum(self._value(k, every) for k in ("compute_s", "recompute_s", "host_sync_s")) + sum(
                self._value(f"{k}_exposed_s", every) for k in STAGE_COMM)
            ok = (mbase > 0) & (mstage > 0)
            mfactor = np.where(ok, self._value("bubble_s", every) / np.where(ok, mbase * mstage, 1.0), 0.0)
            ref = self._nearest(codes, (("pp_schedule",), ("pp", "vpp", "mbs")), piped,
                                cache=block and (block, "bubble_s"))
            rprior = np.array([BUBBLE_PRIOR.get(x, 1.0) for x in mf["pp_schedule"]])[ref]
            filled = prior < 1.0  # a zero-bubble schedule (:data:`BUBBLE_PRIOR`)
            rfilled = rprior < 1.0
            factor = np.where(sched == mf["pp_schedule"][ref], mfactor[ref],
                              np.where(rfilled & ~filled, prior, mfactor[ref] * prior / rprior))
        out["bubble_s"] = np.where(f["pp"] > 1, factor * (f["pp"] - 1) / (f["micro"] * f["vpp"]) * stage, 0.0)
        out["total"] = sum(out.values())
        return out

    def _present(self, kind: str, f: Mapping[str, np.ndarray]) -> np.ndarray:
        fsdp = f["fsdp"] == "True"
        if kind == "tp":
            return f["tp"] > 1
        if kind == "cp":
            return f["cp"] > 1
        if kind == "ep_a2a":
            return f["ep"] > 1
        if kind == "pp_p2p":
            return f["pp"] > 1
        if kind in ("fsdp_ag", "fsdp_rs"):
            return fsdp
        if kind == "dp_param_gather":
            return ~fsdp & (f["use_distributed_optimizer"] == "True")
        if kind == "expert_grad":
            return ~fsdp & bool(self.expert_params)
        return ~fsdp

    def _comm(self, kind: str, codes: np.ndarray, f: Mapping[str, np.ndarray], mf: Mapping[str, np.ndarray],
              busy: np.ndarray, block: Any = None) -> np.ndarray:
        """Exposed seconds of one communication kind at each candidate (0 where no trial has shown it)."""
        rows = self._measured(f"{kind}_total_s")
        present = self._present(kind, f)
        if not present.any():
            return np.zeros(len(codes))
        drv = self._static(block, ("driver", kind), lambda: self.driver(kind, f))
        if not len(rows):
            # no trial has shown this kind: its physical time at the links' bandwidth, with the overlap
            # :data:`OVERLAP_PRIOR` allows (none for the collectives on the critical path)
            return np.where(present, np.maximum(0.0, drv - OVERLAP_PRIOR.get(kind, 0.0) * busy), 0.0)
        mdrv = self.driver(kind, mf)
        regime = (self._static(block, ("across", kind), lambda: self._across(kind, f)), self._across(kind, mf))
        logd = (self._static(block, ("logdriver", kind), lambda: np.log(np.maximum(drv, 1e-12))),
                np.log(np.maximum(mdrv, 1e-12)))
        keys = TERM_KEYS.get(kind, ((), ()))
        # the traffic is carried from the point whose links and volume are nearest (fewest e-folds of the driver);
        # how much of it hides is read at the point nearest in the settings around it (schedule, pipeline, savers)
        ref = self._nearest(codes, keys, rows, extra=regime, cache=block and (block, kind), scale=logd)
        near = self._nearest(codes, keys, rows, cache=block and (block, kind, "overlap"))
        ratio = np.where(mdrv[ref] > 0, drv / np.where(mdrv[ref] > 0, mdrv[ref], 1.0), 1.0)
        # another regime (inside a node vs across nodes) than any measured point: the links' ratio is the least
        # certain part, so it is carried half-way (in log) until a trial measures that regime
        ratio = np.where(regime[0] != regime[1][ref], np.sqrt(ratio), ratio)
        total = self._value(f"{kind}_total_s", ref) * ratio
        rtotal = self._value(f"{kind}_total_s", near)
        rexposed = self._value(f"{kind}_exposed_s", near)
        rbusy = self._value("compute_s", near) + self._value("recompute_s", near)
        if kind in POST_FLUSH:  # hidden under one micro-batch's pass, not the whole step's
            busy, rbusy = busy / f["micro"], rbusy / mf["micro"][near]
        return np.where(present, self._exposed(total, busy, rtotal, rexposed, rbusy), 0.0)

    @staticmethod
    def _exposed(total: np.ndarray, busy: np.ndarray, rtotal: np.ndarray, rexposed: np.ndarray,
                 rbusy: np.ndarray) -> np.ndarray:
        """Exposed seconds of a term of ``total`` seconds beside ``busy`` seconds of compute, from a reference that
        left ``rexposed`` of ``rtotal`` exposed beside ``rbusy``. Overlap has two limits: a share of each transfer
        that waits anyway (the first layer's gather, the tail), and the compute there is to hide under. A
        reference that left a small share exposed (at most :data:`SHARE_LIMITED`), or hid less than half its
        compute's worth, shows the share (and can hide at least its compute's worth); one that left more exposed
        while hiding more shows the capacity (its share is then taken as :data:`EXPOSED_SHARE`); one that hid it all
        shows only a lower bound of the capacity, taken twice over."""
        safe_total = np.where(rtotal > 0, rtotal, 1.0)
        safe_busy = np.where(rbusy > 0, rbusy, 1.0)
        share = np.clip(rexposed / safe_total, 0.0, 1.0)
        cap = np.maximum(rtotal - rexposed, 0.0) / safe_busy
        hidden_all = share < 0.01
        limited = (share > SHARE_LIMITED) & (cap >= 0.5)
        share = np.where(limited, np.minimum(share, EXPOSED_SHARE), share)
        cap = np.where(hidden_all, np.maximum(1.0, 2.0 * cap), np.where(limited, cap, np.maximum(1.0, cap)))
        return np.maximum(share * total, total - cap * busy)

    def times(self, codes: np.ndarray, block: Any = None) -> np.ndarray:
        """Predicted iteration seconds of each point of a block."""
        return self.predict(codes, block)["total"]
