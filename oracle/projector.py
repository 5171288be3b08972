"""The projection oracle: memory + iteration time for one RunConfig (paper Eq. 1).

    iteration = pipeline makespan (per-stage F/B/W from the layer model, P2P on the edges)
              + exposed data-parallel gradient sync (expert part on the critical path when EP > 1)
              + exposed distributed-optimizer parameter all-gather
              + exposed FSDP reduce-scatter
              + optimizer step (bytes over HBM bandwidth)

Layer times come from a swappable source (``LayerTimeSource``): simulate mode prices them
analytically (oracle.compute); benchmark mode (measured torch layers) plugs in the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from collections.abc import Sequence
from typing import Any

from oracle.comm import CommModel, Topology
from oracle.compute import BF16, DP_BUCKET_ELEMS, FP32, LayerModel
from oracle.config import RunConfig
from oracle.errors import BenchmarkError, InvalidConfigError
from oracle.flops import flop_formula, model_flops_per_token
from oracle.hardware import HardwareProfile
from oracle.layout import Layout, bf16_layers, placement_key
from oracle.memory import chunk_activation_shares, offloaded_bytes_per_microbatch, project_memory, rank_param_counts
from oracle.opgraph import GEMM, Shapes, kv_heads_per_rank, layer_ops
from oracle.optimizers import layer_newton_schulz_s, step_time_s
from oracle.pipeline import StageCosts, get_schedule, lower_bound_s, quantized, run_schedule, run_schedule_many
from oracle.pipeline.schedules.ilp import SEARCH_BUDGET as ILP_SEARCH_BUDGET
from oracle.pipeline.schedules.ilp import work_budget as ilp_work_budget
from oracle.results import CommTerm, Projection, TimeBreakdown
from oracle.units import GIB

MODES = ("simulate", "benchmark", "both")
# FSDP per-phase overlap ceilings (paper App. B.4): forward all-gather, recompute all-gather, reduce-scatter.
FSDP_CEIL_AG, FSDP_CEIL_RECOMPUTE_AG, FSDP_CEIL_RS = 0.95, 0.93, 0.92


@lru_cache(maxsize=256)
def comm_model(hw: HardwareProfile, num_gpus: int) -> CommModel:
    return CommModel(Topology.from_profile(hw, num_gpus))


@dataclass(frozen=True, slots=True)
class _Chunk:
    """One micro-batch through one (rank, chunk): what the pipeline simulator and the breakdown read."""

    f_s: float
    """Forward op time: compute + exposed communication + host stalls."""
    b_s: float
    """Backward (input-gradient) op time, with recompute, exposed communication and host stalls."""
    w_s: float
    """Weight-gradient op time."""
    f_compute_s: float
    """Forward GEMM/attention compute alone."""
    b_compute_s: float
    """Input-gradient compute alone."""
    w_compute_s: float
    """Weight-gradient compute alone."""
    recompute_s: float
    """Activation recomputation replayed in the backward."""
    host_s: float
    """GPU idle after MoE dispatcher syncs (forward passes and their full-recompute replays)."""
    comm_exposed: dict[str, float]
    """Exposed communication seconds per kind."""
    comm_total: dict[str, float]
    """Total (overlapped + exposed) communication seconds per kind."""


def _add(d: dict[str, float], k: str, v: float) -> None:
    if v:
        d[k] = d.get(k, 0.0) + v


_ChunkKey = tuple[tuple[tuple[tuple[str, int | None, bool, bool], int], ...], bool, bool, int]
"""What a (rank, chunk)'s costs depend on besides the run: its layer groups (kind, window, replayed by full
recompute, kept in BF16 by first_last_layers_bf16) with their counts in layer order, embedding, output (loss),
MTP modules."""


def _chunk_key(run: RunConfig, L: Layout, rank: int, chunk: int) -> _ChunkKey:
    m = run.model
    layers = L.stage_layers[rank][chunk]
    n_rec = L.recomputed_layers(rank, chunk)
    head, tail = bf16_layers(run)
    # identical layers cost the same: group by (kind, window, replayed by full recompute, BF16)
    groups: dict[tuple[str, int | None, bool, bool], int] = {}
    for j, i in enumerate(layers):
        hp = i < head or i >= m.num_layers - tail
        key = (m.layer_kinds[i], m.sliding_window if m.uses_window(i) else None, j < n_rec, hp)
        groups[key] = groups.get(key, 0) + 1
    st = L.stage(rank, chunk)
    return tuple(groups.items()), st.embedding, st.loss, st.mtp


_CHUNK_KINDS: dict[tuple, tuple[tuple[_ChunkKey, ...], tuple[tuple[int, ...], ...]]] = {}


def _chunk_kinds(run: RunConfig, L: Layout) -> tuple[tuple[_ChunkKey, ...], tuple[tuple[int, ...], ...]]:
    """The distinct chunk keys of ``run`` and, per rank and chunk, the index of its key (cached on
    ``placement_key``: chunks with the same key cost the same, so each is priced once per projection)."""
    key = placement_key(run)
    hit = _CHUNK_KINDS.get(key)
    if hit is not None:
        return hit
    t = run.training
    index: dict[_ChunkKey, int] = {}
    rows = tuple(tuple(index.setdefault(_chunk_key(run, L, r, c), len(index)) for c in range(t.vpp))
                 for r in range(t.pp))
    if len(_CHUNK_KINDS) > 4096:
        _CHUNK_KINDS.clear()
    hit = _CHUNK_KINDS[key] = (tuple(index), rows)
    return hit


def _chunk_costs(run: RunConfig, L: Layout, lm: LayerModel, rank: int, chunk: int) -> _Chunk:
    return _priced_chunk(run, lm, _chunk_key(run, L, rank, chunk))


def _priced_chunk(run: RunConfig, lm: LayerModel, key: _ChunkKey) -> _Chunk:
    """The costs of a (rank, chunk) with layers, embedding, output and MTP modules ``key`` (see _chunk_key)."""
    m, t = run.model, run.training
    groups, has_embedding, has_output, n_mtp = key
    f = b = w = rec = comm_f = host_f = host_rec = host_b = 0.0
    exp: dict[str, float] = {}
    tot: dict[str, float] = {}
    for (kind, window, replayed, hp), n in groups:
        c = lm.layer_bf16(kind, window) if hp and hasattr(lm, "layer_bf16") else lm.layer(kind, window)
        f += n * c.f_s
        b += n * c.b_s
        w += n * c.w_s
        comm_f += n * c.f_exposed_comm_s
        host_f += n * c.host_f_s
        host_b += n * c.host_b_s
        for k, part in c.comm.items():
            _add(exp, k, n * (part.f_exposed_s + part.b_exposed_s))
            _add(tot, k, n * (part.f_total_s + part.b_total_s))
        if replayed:  # full recompute replays the layer forward (incl. its TP/CP/EP comm) before B;
            # the replayed comm is counted once, through exp -> comm_b, not again in rec
            rec += n * c.f_s
            host_rec += n * c.host_f_s
            for k, part in c.comm.items():
                _add(exp, k, n * part.f_exposed_s)
                _add(tot, k, n * part.f_total_s)
        elif t.recompute == "selective":  # the recompute_modules' forward, once, before B
            rec += n * ((c.attn_f_s if "core_attn" in t.recomputed_modules else 0.0) + c.replay_f_s)
            host_rec += n * c.replay_host_s
            for k in c.replay_comm:
                _add(exp, k, n * c.comm[k].f_exposed_s)
                _add(tot, k, n * c.comm[k].f_total_s)
    comm_b = sum(exp.values()) - comm_f
    if has_embedding:
        ef, eb = lm.embedding()
        f += ef
        b += eb
    of = ob = ow = 0.0
    if has_output:
        of, ob, ow = lm.output()
        f, b, w = f + of, b + ob, w + ow
    if n_mtp:  # MTP modules (with the loss, or on a stage of their own): one extra decoder layer + output head each
        if not has_output:
            of, ob, ow = lm.output()
        kind = "moe" if m.is_moe else "dense"
        c = lm.layer(kind, None)
        f += n_mtp * (c.f_s + of)
        host_f += n_mtp * c.host_f_s
        host_b += n_mtp * c.host_b_s
        b += n_mtp * (c.b_s + ob)
        w += n_mtp * (c.w_s + ow)
    return _Chunk(f_s=f + comm_f + host_f, b_s=b + rec + comm_b + host_rec + host_b, w_s=w, f_compute_s=f,
                  b_compute_s=b, w_compute_s=w, recompute_s=rec, host_s=host_f + host_rec + host_b,
                  comm_exposed=exp, comm_total=tot)


_P2P_EDGES: dict[tuple, tuple[list[float], str]] = {}


def _p2p_edges(run: RunConfig, L: Layout, comm: CommModel) -> tuple[list[float], str]:
    """P2P time of each virtual-stage boundary v -> v+1 (activation forward, gradient backward)."""
    t, m = run.training, run.model
    n_virtual = t.pp * t.vpp
    if t.pp == 1:
        return [0.0] * max(0, n_virtual - 1), ""
    tokens = t.mbs * t.seq_len // t.cp // (t.tp if t.sp else 1)
    nbytes = BF16 * tokens * m.hidden_size
    # the edges depend on the comm model, the pipeline group, the stage map and the message size alone
    key = (comm, L.group("pp"), t.pp, t.vpp, L.v_shape, nbytes)
    hit = _P2P_EDGES.get(key)
    if hit is not None:
        return list(hit[0]), hit[1]
    owner = {}
    for r in range(t.pp):
        for c in range(t.vpp):
            owner[L.virtual_stage(r, c)] = r
    edges = []
    algo = ""
    for v in range(n_virtual - 1):
        a, b = owner[v], owner[v + 1]
        if a == b:
            edges.append(0.0)
            continue
        cost = comm.p2p_members(L.group("pp"), a, b, nbytes)  # worst pipeline replica's tier for this edge
        edges.append(cost.time_s)
        algo = cost.algorithm
    if len(_P2P_EDGES) > 4096:
        _P2P_EDGES.clear()
    _P2P_EDGES[key] = (tuple(edges), algo)
    return edges, algo


class LayerTimeSource:
    """Where layer times come from; this base is simulate mode (the analytical LayerModel).

    Benchmark mode (oracle.benchmark.source.BenchmarkSource) overrides it with measured torch layers.
    The same object is the Ray device scorers' timer (raytune_primus.actors.LayerTimer): ``shapes``
    names what a run needs measured, ``measure`` times one shape, ``project`` scores a run from timings.
    """

    name = "simulate"
    tag = "analytical"
    mode = "simulate"

    def layer_model(self, L: Layout, comm: CommModel) -> LayerModel:
        return LayerModel(L, comm)

    def shapes(self, run: RunConfig) -> list[str]:
        """Layer shapes ``run`` needs measured (none: simulate mode measures nothing)."""
        return []

    def measure(self, shape: str, gpu_ids: Any = ()) -> Any:
        raise BenchmarkError(f"simulate mode measures nothing (asked for {shape!r})")

    def memory(self, run: RunConfig) -> Any:
        return project_memory(run, trees="none")

    def project(self, run: RunConfig, timings: Any = None, **kw: Any) -> Projection:
        return project(run, mode=self.mode, source=self, **kw)


def _pipeline_inputs(run: RunConfig, src: LayerTimeSource):
    """Layout, comm model, per-(rank, chunk) costs and the StageCosts the schedule simulator runs."""
    t = run.training
    L = Layout(run)
    comm = comm_model(run.cluster.hardware, run.cluster.num_gpus)
    lm = src.layer_model(L, comm)
    # chunks with the same layers, embedding, loss and MTP modules cost the same: price each kind once
    kinds, rows = _chunk_kinds(run, L)
    priced = [_priced_chunk(run, lm, key) for key in kinds]
    chunks = [[priced[i] for i in row] for row in rows]
    spec = get_schedule(t.schedule)
    split = spec.splits_bw
    edges, p2p_algo = _p2p_edges(run, L, comm)
    # activation "bytes" in units of a full micro-batch of the rank, so the simulator's peak is the
    # in-flight count the memory model wants (B/W release fractions included); each chunk weighs its
    # share of the rank's activation, so uneven pipeline layouts count chunks at their size
    act = chunk_activation_shares(run)
    f = tuple(tuple(c.f_s for c in row) for row in chunks)
    if split:
        b = tuple(tuple(c.b_s for c in row) for row in chunks)
        w = tuple(tuple(c.w_s for c in row) for row in chunks)
    else:
        b = tuple(tuple(c.b_s + c.w_s for c in row) for row in chunks)
        w = tuple((0.0,) * len(row) for row in chunks)
    costs = StageCosts.trusted(f_s=f, b_s=b, w_s=w, act_bytes=act, p2p_s=tuple(edges), p2p_blocking=spec.blocking_p2p)
    return L, comm, chunks, costs, edges, p2p_algo


def _token_drop_warnings(t) -> list[str]:
    """What a capacity factor does to the trained tokens and to the work (a projection ranks speed only)."""
    cf = t.moe_expert_capacity_factor
    if cf is None:
        return []
    out = []
    if t.moe_imbalance > cf:
        out.append(f"token-drop MoE: the busiest expert receives {t.moe_imbalance:g}x its mean share and keeps "
                   f"{cf:g}x: it drops {1 - cf / t.moe_imbalance:.0%} of its tokens (training quality is not projected)")
    elif cf < 1.0:
        out.append(f"token-drop MoE: capacity factor {cf:g} < 1 drops tokens even under balanced routing")
    if t.moe_pad_expert_input_to_capacity and cf > 1.0:
        out.append(f"drop-and-pad: every expert computes {cf:g}x its mean share; on average {1 - 1 / cf:.0%} of "
                   "the expert GEMM rows are padding")
    return out


def _iteration_extras(run: RunConfig, L: Layout, comm: CommModel, chunks, crit: int
                      ) -> tuple[list[CommTerm], float, float]:
    """Terms added after the pipeline flush on rank ``crit``: exposed DP gradient sync (expert part
    on the critical path when EP > 1), exposed distributed-optimizer parameter gather, exposed FSDP
    traffic, and the optimizer step. Returns (comm terms, exposed seconds, optimizer seconds)."""
    t = run.training
    mb = L.num_microbatches
    terms: list[CommTerm] = []
    last_mb_bwd = sum(c.b_s + c.w_s for c in chunks[crit])
    first_mb_fwd = sum(c.f_s for c in chunks[crit])
    dense_p, expert_p = rank_param_counts(run, crit)
    dp_cp = L.dp * t.cp
    grad_b = FP32 if t.grad_reduce_in_fp32 else BF16
    extra_exposed = 0.0
    if t.fsdp:
        # ZeRO-3: per micro-batch all-gather of each layer's bf16 weights (fwd and again in bwd),
        # reduce-scatter of fp32 grads once; overlap = min(1, compute/comm) x ceiling (paper App. B.4). TorchTitan
        # under pipeline parallelism keeps the weights unsharded for the step (fsdp_keeps_unsharded): one gather
        ag = comm.cost("all_gather", L.group("dp_cp"), BF16 * dense_p) if dp_cp > 1 else None
        ag_e = comm.cost("all_gather", L.group("edp"), BF16 * expert_p) if expert_p and L.edp > 1 else None
        ag_t = (ag.time_s if ag else 0.0) + (ag_e.time_s if ag_e else 0.0)
        ceil_b = FSDP_CEIL_RECOMPUTE_AG if t.recompute == "full" else FSDP_CEIL_AG
        ov_f = min(1.0, first_mb_fwd / ag_t) * FSDP_CEIL_AG if ag_t else 1.0
        ov_b = min(1.0, last_mb_bwd / ag_t) * ceil_b if ag_t else 1.0
        if t.fsdp_keeps_unsharded:  # gathered once in the first micro-batch's forward, kept for the step
            fsdp_ag_total = ag_t
            fsdp_ag_exposed = ag_t * (1 - ov_f)
        else:
            fsdp_ag_total = mb * 2 * ag_t
            fsdp_ag_exposed = mb * ag_t * ((1 - ov_f) + (1 - ov_b))
        terms.append(CommTerm(kind="fsdp_ag", total_s=fsdp_ag_total, exposed_s=fsdp_ag_exposed,
                              algorithm=ag.algorithm if ag else ""))
        extra_exposed += fsdp_ag_exposed
        rs = comm.cost("reduce_scatter", L.group("dp_cp"), grad_b * dense_p) if dp_cp > 1 else None
        rs_e = comm.cost("reduce_scatter", L.group("edp"), grad_b * expert_p) if expert_p and L.edp > 1 else None
        rs_t = (rs.time_s if rs else 0.0) + (rs_e.time_s if rs_e else 0.0)
        ov_rs = min(1.0, last_mb_bwd / rs_t) * FSDP_CEIL_RS if rs_t else 1.0
        rs_exp = rs_t * (1 - ov_rs)
        terms.append(CommTerm(kind="fsdp_rs", total_s=rs_t, exposed_s=rs_exp, algorithm=rs.algorithm if rs else ""))
        extra_exposed += rs_exp
    else:
        kind = "reduce_scatter" if t.use_distributed_optimizer else "all_reduce"
        g = comm.cost(kind, L.group("dp_cp"), grad_b * dense_p) if dp_cp > 1 and dense_p else None
        ge = comm.cost(kind, L.group("edp"), grad_b * expert_p) if L.edp > 1 and expert_p else None
        g_t = g.time_s if g else 0.0
        ge_t = ge.time_s if ge else 0.0
        if t.overlap_grad_reduce:
            # buckets reduce as the last micro-batch's backward produces them; the last bucket is exposed
            last_bucket = g_t * min(1.0, DP_BUCKET_ELEMS / dense_p) if dense_p else 0.0
            g_exp = max(g_t - last_mb_bwd, last_bucket)
            # expert grads: A2A barriers keep them off the overlap window when EP > 1 (paper App. B.3)
            ge_exp = ge_t if t.ep > 1 else max(0.0, ge_t - max(0.0, last_mb_bwd - g_t))
        else:
            g_exp, ge_exp = g_t, ge_t
        terms.append(CommTerm(kind="dp_grad", total_s=g_t, exposed_s=g_exp, algorithm=g.algorithm if g else ""))
        if expert_p:
            terms.append(CommTerm(kind="expert_grad", total_s=ge_t, exposed_s=ge_exp,
                                  algorithm=ge.algorithm if ge else ""))
        extra_exposed += g_exp + ge_exp
        if t.use_distributed_optimizer:
            # fp8_param_gather: FP8 weights gathered at 1 B (embedding/head/norms stay BF16: < 1% of a
            # large model's parameters, counted at 1 B too)
            pw = 1 if t.fp8_param_gather else BF16
            pg = comm.cost("all_gather", L.group("dp_cp"), pw * dense_p) if dp_cp > 1 and dense_p else None
            pge = comm.cost("all_gather", L.group("edp"), pw * expert_p) if L.edp > 1 and expert_p else None
            pg_t = (pg.time_s if pg else 0.0) + (pge.time_s if pge else 0.0)
            pg_exp = max(0.0, pg_t - first_mb_fwd) if t.overlap_param_gather else pg_t
            terms.append(CommTerm(kind="dp_param_gather", total_s=pg_t, exposed_s=pg_exp,
                                  algorithm=pg.algorithm if pg else ""))
            extra_exposed += pg_exp
    shard_dense = dense_p / dp_cp if (t.use_distributed_optimizer or t.fsdp) else dense_p
    shard_exp = expert_p / L.edp if (t.use_distributed_optimizer or t.fsdp) else expert_p
    if t.optimizer == "muon":
        matrices, ns_dense, ns_exp = _rank_matrices(run, L, crit)
        share = min(1.0, matrices / max(1.0, dense_p + expert_p))
        # the layer-wise distributed optimizer (Megatron-LM: --optimizer muon with --use-distributed-optimizer;
        # TorchTitan: DistMuon over FSDP, distributed/flex_shard/dist_muon.py, complete matrices per rank) deals whole
        # matrices over the ranks that hold copies of them, dense over dp x cp and experts over edp; without it every
        # rank orthogonalises every matrix it holds
        layer_wise = t.use_distributed_optimizer or (t.fsdp and t.framework == "torchtitan")
        ns_s = ns_dense / max(1, dp_cp) + ns_exp / max(1, L.edp) if layer_wise else ns_dense + ns_exp
        optimizer_s = step_time_s(run, shard_dense + shard_exp, share, ns_s)
    else:
        optimizer_s = step_time_s(run, shard_dense + shard_exp, 0.0, 0.0)
    if t.cpu_offloading or t.offload_modules:
        term = _cpu_offload_term(run, chunks[crit], mb, crit)
        terms.append(term)
        extra_exposed += term.exposed_s

    return terms, extra_exposed, optimizer_s


def _rank_matrices(run: RunConfig, L: Layout, rank: int) -> tuple[float, float, float]:
    """(2-D weight parameters, dense and routed-expert Newton-Schulz seconds) of the decoder layers pipeline rank
    ``rank`` holds, per GPU (the tensor/expert-parallel shards of its op graphs; MTP modules count as decoder
    layers)."""
    hw, t = run.cluster.hardware, run.training
    shapes = Shapes.of(run)
    kinds, rows = _chunk_kinds(run, L)
    m = run.model
    qkv_rows: tuple[int, ...] = ()
    if m.attention != "mla":  # the fused QKV weight's Q, K, V blocks on this rank (oracle.opgraph.attention_ops)
        kv = int(kv_heads_per_rank(m, t.tp) * m.head_size)
        qkv_rows = (m.q_width // t.tp, kv, kv)
    params = ns_dense = ns_exp = 0.0
    for c in rows[rank]:
        groups, _, _, n_mtp = kinds[c]
        counts = [((kind, window), n) for (kind, window, _, _), n in groups]
        if n_mtp:  # the MTP modules' weights (one set when their depths share it)
            counts.append((("moe" if run.model.is_moe else "dense", None),
                           min(n_mtp, run.model.mtp_weight_sets)))
        for (kind, window), n in counts:
            ops = layer_ops(run.model, shapes, kind, window)
            params += n * sum(op.groups * op.k * op.n for op in ops if op.kind == GEMM and op.has_wgrad)
            d, e = layer_newton_schulz_s(hw, ops, t.muon_ns_steps, qkv_rows)
            ns_dense, ns_exp = ns_dense + n * d, ns_exp + n * e
    return params, ns_dense, ns_exp


def _cpu_offload_term(run: RunConfig, chunks, mb: int, rank: int = 0) -> CommTerm:
    """Megatron-Core CPU offloading (pp = 1) and fine-grained activation offloading (any pp): the saved activations
    (and with ``cpu_offloading_weights`` the weights) of ``cpu_offloading_num_layers`` layers, or what the
    ``offload_modules`` save in every layer of pipeline rank ``rank``, go to host memory during the forward and come
    back during the backward, over the host link (profile ``host_link_gb_per_s``) beside the other layers' compute:
    a micro-batch's copies are exposed where they outlast its forward (backward) compute."""
    hw = run.cluster.hardware
    nbytes = offloaded_bytes_per_microbatch(run, rank=rank)
    copy = nbytes / hw.host_link_bytes_per_s if hw.host_link_bytes_per_s else 0.0
    f = sum(c.f_compute_s for c in chunks)
    b = sum(c.b_compute_s + c.w_compute_s for c in chunks)
    exposed = mb * (max(0.0, copy - f) + max(0.0, copy - b))
    return CommTerm(kind="cpu_offload", total_s=2 * mb * copy, exposed_s=exposed, algorithm="host link")


def pipeline_result(run: RunConfig, *, source: LayerTimeSource | None = None):
    """The simulated pipeline schedule of ``run`` (for Gantt charts); None when pp == 1."""
    if run.training.pp == 1:
        return None
    L, _, _, costs, _, _ = _pipeline_inputs(run, source or LayerTimeSource())
    t = run.training
    return run_schedule(t.schedule, t.pp, t.vpp, L.num_microbatches, costs)


def tokens_per_s_per_gpu_upper_bound(run: RunConfig, *, source: LayerTimeSource | None = None) -> float:
    """A cheap, provable upper bound on ``project(run).tokens_per_s_per_gpu``.

    The makespan of ANY order of this pipeline is at least the simulator's critical-path bound
    (``lower_bound_s``), and the post-flush terms are at least their minimum over ranks; so a search can
    skip an expensive cost-aware schedule (the ilp MILP, greedy V orders) whose bound cannot beat its
    incumbent, and the exhaustive optimum stays exact.
    """
    t = run.training
    L, comm, chunks, costs, edges, _ = _pipeline_inputs(run, source or LayerTimeSource())
    mb = L.num_microbatches
    if t.pp == 1:
        makespan_lb = mb * sum(c.f_s + c.b_s + c.w_s for c in chunks[0])
    else:
        spec = get_schedule(t.schedule)
        makespan_lb = lower_bound_s(t.pp, t.vpp, spec.layout, mb, costs)
    # ranks holding the same chunks (the middle of a pipeline) have the same post-flush terms: one each
    firsts: dict[tuple[int, ...], int] = {}
    for r, row in enumerate(_chunk_kinds(run, L)[1]):
        firsts.setdefault(row, r)
    extras = min(sum(_iteration_extras(run, L, comm, chunks, r)[1:]) for r in firsts.values())
    return t.gbs * t.seq_len / (makespan_lb + extras) / run.cluster.num_gpus


def project(run: RunConfig, mode: str = "simulate", *, source: LayerTimeSource | None = None,
            fast_schedules: bool = False, memory_tree: bool = True) -> Projection:
    """Project memory and throughput of ``run`` (already legality-checked by RunConfig).

    ``fast_schedules``: cost-aware schedules (ilp, zbv_greedy, v_half, v_min) build their order from
    costs quantised to 1/32 of the largest op, so a search reuses solved orders across similar
    configurations (seconds -> milliseconds for ilp); the replay uses exact costs and the result says so.
    ``memory_tree=False`` skips the per-module memory tree (searches do not read it).
    The batch of one of :func:`project_many`.
    """
    out = project_many([run], mode, source=source, fast_schedules=fast_schedules, memory_tree=memory_tree,
                       errors="raise")
    return out[0]  # type: ignore[return-value]


def project_many(runs: Sequence[RunConfig], mode: str = "simulate", *, source: LayerTimeSource | None = None,
                 fast_schedules: bool = False, memory_tree: bool = True,
                 errors: str = "raise") -> list[Projection | Exception]:
    """:func:`project` of every run of ``runs``, in order, with exactly the same results; the batch shares
    what its runs share: runs with the same fixed-order pipeline plan (schedule, pp, vpp, micro-batches) are
    replayed together (``run_schedule_many``, numpy over the runs). The grid and exhaustive sweeps, the
    branch-and-bound optimum, ``validate`` and Ray bulk scoring score through it.

    ``errors='raise'`` raises the first run's error; ``'return'`` puts each failing run's exception in its
    place, so one bad configuration does not lose a batch.
    """
    if mode not in MODES:
        raise InvalidConfigError(f"mode={mode!r} is not one of {' | '.join(MODES)}")
    if mode != "simulate" and source is None:
        raise BenchmarkError(f"mode={mode} needs measured layer times: pass source=oracle.benchmark.source."
                             f"BenchmarkSource() (the CLI does with --mode benchmark|both)")
    if errors not in ("raise", "return"):
        raise InvalidConfigError(f"errors={errors!r} must be 'raise' or 'return'")
    src = source or LayerTimeSource()
    out: list[Any] = [None] * len(runs)
    inputs: list[Any] = [None] * len(runs)
    groups: dict[tuple, list[int]] = {}
    for i, run in enumerate(runs):
        try:
            inputs[i] = _pipeline_inputs(run, src)
        except Exception as exc:  # noqa: BLE001 - kept per run (errors='return') or raised below
            if errors == "raise":
                raise
            out[i] = exc
            continue
        t = run.training
        if t.pp > 1 and not get_schedule(t.schedule).cost_aware:
            groups.setdefault((t.schedule, t.pp, t.vpp, inputs[i][0].num_microbatches), []).append(i)
    replays: dict[int, Any] = {}
    for (name, pp, vpp, mb), idx in groups.items():
        if len(idx) < 2:
            continue
        try:
            for i, res in zip(idx, run_schedule_many(name, pp, vpp, mb, [inputs[i][3] for i in idx])):
                replays[i] = res
        except Exception:  # noqa: BLE001 - each run then replays (and fails) alone, with its own error
            continue
    for i, run in enumerate(runs):
        if out[i] is not None:
            continue
        try:
            out[i] = _project_one(run, mode, src, inputs[i], replays.get(i), fast_schedules, memory_tree)
        except Exception as exc:  # noqa: BLE001
            if errors == "raise":
                raise
            out[i] = exc
    return out


def _replay(run: RunConfig, costs: StageCosts, mb: int, fast_schedules: bool):
    """The pipeline replay of one run (``timeline=False``)."""
    t = run.training
    if fast_schedules and get_schedule(t.schedule).cost_aware:
        # only cost-aware orders are built from costs (and solved under a budget): a fixed order needs neither
        with ilp_work_budget(ILP_SEARCH_BUDGET):
            return run_schedule(t.schedule, t.pp, t.vpp, mb, costs, plan_costs=quantized(costs), timeline=False)
    return run_schedule(t.schedule, t.pp, t.vpp, mb, costs, timeline=False)


def _project_one(run: RunConfig, mode: str, src: LayerTimeSource, inputs, res, fast_schedules: bool,
                 memory_tree: bool) -> Projection:
    """One projection from its pipeline inputs and, when the batch replayed it, its pipeline result."""
    t, m, hw = run.training, run.model, run.cluster.hardware
    n = run.cluster.num_gpus
    L, comm, chunks, costs, edges, p2p_algo = inputs
    pp, vpp, mb = t.pp, t.vpp, L.num_microbatches
    if pp == 1:
        per_mb = sum(c.f_s + c.b_s + c.w_s for c in chunks[0])
        makespan = mb * per_mb
        busy = [makespan]
        in_flight = None
        p2p_total = 0.0
    else:
        if res is None:
            res = _replay(run, costs, mb, fast_schedules)
        makespan = res.makespan_s
        busy = list(res.busy_s)
        in_flight = list(res.peak_activation_bytes)
        p2p_total = 2 * mb * sum(edges)
    crit = max(range(pp), key=lambda r: busy[r])
    # blocking sends hold the critical rank: report them as exposed P2P, not as bubble
    p2p_held = (mb * sum(fs + bs for fs, bs in costs.send_s(get_schedule(t.schedule).layout)[crit])
                if pp > 1 and costs.p2p_blocking else 0.0)
    memory = project_memory(run, in_flight=in_flight, trees="worst" if memory_tree else "none")

    terms, extra_exposed, optimizer_s = _iteration_extras(run, L, comm, chunks, crit)
    exp_comm: dict[str, float] = {}
    tot_comm: dict[str, float] = {}
    for c in chunks[crit]:
        for k, v in c.comm_exposed.items():
            _add(exp_comm, k, mb * v)
        for k, v in c.comm_total.items():
            _add(tot_comm, k, mb * v)

    for k in sorted(set(tot_comm) | set(exp_comm)):
        terms.append(CommTerm(kind=k, total_s=tot_comm.get(k, 0.0), exposed_s=exp_comm.get(k, 0.0),
                              algorithm=""))
    if pp > 1:
        terms.append(CommTerm(kind="pp_p2p", total_s=p2p_total, exposed_s=p2p_held, algorithm=p2p_algo))

    iteration = makespan + extra_exposed + optimizer_s
    tokens = t.gbs * t.seq_len
    tps = tokens / iteration / n
    flops_tok = model_flops_per_token(m, t.seq_len)
    tflops = tps * flops_tok / 1e12
    peak = hw.peak_flops(t.gemm_dtype)
    compute = mb * sum(c.f_compute_s + c.b_compute_s + c.w_compute_s for c in chunks[crit])
    recompute = mb * sum(c.recompute_s for c in chunks[crit])
    host_sync = mb * sum(c.host_s for c in chunks[crit])
    bubble = max(0.0, makespan - busy[crit] - p2p_held)
    breakdown = TimeBreakdown(compute_s=compute, recompute_s=recompute, bubble_s=bubble, optimizer_s=optimizer_s,
                              host_sync_s=host_sync, comm=tuple(terms),
                              sources={"compute": src.tag, "recompute": src.tag, "comm": "analytical",
                                       "bubble": "analytical", "optimizer": "analytical",
                                       "host_sync": "analytical"})
    details: dict[str, Any] = {
        "schedule": t.schedule, "num_microbatches": mb, "dp": L.dp, "edp": L.edp,
        "critical_rank": crit, "flop_formula": flop_formula(m), "model_flops_per_token": flops_tok,
        "mfu_peak": f"{t.gemm_dtype} dense peak of {hw.name}",
        "stage_times_s": [[{"f": c.f_s, "b": c.b_s, "w": c.w_s} for c in row] for row in chunks],
        "makespan_s": makespan,
        "schedule_approximate": bool(pp > 1 and res.approximate),
        "schedule_note": res.note if pp > 1 else "",
    }
    warnings = []
    if not memory.fits:
        warnings.append(f"does not fit: peak {memory.peak_bytes / GIB:.1f} GiB > cap {memory.cap_bytes / GIB:.1f} GiB")
    warnings += _token_drop_warnings(t)
    if mode != "simulate" and t.cuda_graph_impl != "none":
        warnings.append(f"cuda_graph_impl={t.cuda_graph_impl}: the benchmark timed eager layers, so the host "
                        "time CUDA graphs would save is not in the measured layer times")
    return Projection(run=run, mode=mode, memory=memory, iteration_time_s=iteration,
                      tokens_per_s_per_gpu=tps, tflops_per_gpu=tflops, mfu=tflops * 1e12 / peak,
                      breakdown=breakdown, warnings=tuple(warnings), details=details)
