"""Benchmark mode's layer-time source: measured torch layers, restored to the target analytically.

:class:`BenchmarkSource` is the benchmark implementation of :class:`oracle.projector.LayerTimeSource`
(the simulate implementation prices layers with oracle.compute). Phases (paper Algorithm 1):

1. downscale the target to ``benchmark_gpus`` (oracle.scaling: PP, then EP with experts/rank kept, then TP);
2. measure one layer per distinct type (dense / moe, window or not) plus embedding and output at the
   downscaled shape on the local device (each rank's shard is timed in one process: every rank of a
   balanced layout does the same work), and the Adam step per parameter;
3. upscale: TP-split ops rescaled by bench_tp / target_tp (expert ops by bench_etp / target_etp), fp8
   GEMM ops by the profile's bf16/fp8 throughput ratio; every collective priced by the communication
   model at the target (no collective is measured by a single-process benchmark, so the EP delta is the
   whole target A2A); PP restored by re-simulating the target schedule from the measured per-layer times.

Torch is imported only when something is measured.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from oracle.benchmark.load import LoadMonitor
from oracle.benchmark.measurement import Measurement
from oracle.benchmark.spec import LayerSpec, layer_spec, run_layer_specs
from oracle.compute import CommPart, LayerCost, LayerModel
from oracle.config import RunConfig
from oracle.errors import BenchmarkError
from oracle.layout import GroupSpec, Layout
from oracle.projector import LayerTimeSource, project
from oracle.scaling import BenchPlan, downscale

# op groups for the upscale rescale (names as oracle.benchmark.torch_layers.OP_NAMES; kept here so this
# module needs no torch)
GEMM_OPS = ("qkv", "attn_out", "mlp_up", "mlp_down", "experts_up", "experts_down", "shared_mlp")
EXPERT_OPS = ("permute", "experts_up", "experts_act", "experts_down", "unpermute")
REPLICATED_OPS = ("router",)
MATMUL_OPS = (*GEMM_OPS, "attn_core")
"""Ops whose time scales with the GEMM throughput of their dtype (an fp32 timing is re-priced as bf16)."""
BF16 = 2


@dataclasses.dataclass(frozen=True, slots=True)
class _Anchor:
    """A collective measured on the benchmark layout and the model's price of the same collective."""

    kind: str
    group: GroupSpec
    model_nbytes: float
    """Size as the communication model takes it (gathered size for all_gather/reduce_scatter)."""
    per_rank_nbytes: int
    """Size as torch.distributed takes it per rank."""


def _anchors(run: RunConfig, plan: BenchPlan) -> dict[str, _Anchor]:
    """The in-scope collectives of the benchmark layout: one TP collective of a layer activation
    (all-gather with sequence parallelism, else all-reduce) and the MoE dispatch All-to-All."""
    t, m = run.training, run.model
    T = t.mbs * t.seq_len // t.cp
    out: dict[str, _Anchor] = {}
    if plan.tp > 1:
        gathered = BF16 * T * m.hidden_size
        if t.sp:
            out["tp"] = _Anchor("all_gather", GroupSpec("tp", plan.tp, 1), gathered, gathered // plan.tp)
        else:
            out["tp"] = _Anchor("all_reduce", GroupSpec("tp", plan.tp, 1), gathered, gathered)
    if plan.ep > 1 and m.is_moe:
        tokens = T // plan.tp if t.sp else T
        per_rank = BF16 * tokens * m.moe_topk * m.hidden_size
        out["ep_a2a"] = _Anchor("all_to_all", GroupSpec("ep", plan.ep, plan.etp), per_rank, per_rank)
    return out


def _gemm_rate(hw: Any, dtype: str, kernel: str = "") -> float:
    """Achievable dense GEMM FLOP/s of ``hw`` in ``dtype``: peak x efficiency (the MXFP8 efficiency for the
    mxfp8 kernel class). fp32 takes bf16's achievable fraction: profiles carry no fp32 GEMM efficiency."""
    if not hw.supports(dtype):
        raise BenchmarkError(f"hardware {hw.name} has no {dtype} peak (compute.peak_tflops has "
                             f"{', '.join(sorted(hw.peak_flops_per_s))}): layers timed in {dtype} cannot be priced "
                             f"on it; add one, or time the layers in another dtype (--dtype)")
    e = hw.efficiency
    if dtype == "fp8":
        return hw.peak_flops_per_s["fp8"] * (e.gemm_mxfp8 if kernel == "mxfp8" and hw.mxfp8_gemms else e.gemm_fp8)
    return hw.peak_flops_per_s[dtype] * e.gemm_bf16


def fp8_speedup(run: RunConfig) -> float:
    """Achievable fp8 / bf16 GEMM throughput of the target profile (peak ratio x efficiency ratio, the MXFP8
    efficiency under fp8_recipe=mxfp8); 1 for bf16."""
    hw = run.cluster.hardware
    if run.training.precision != "fp8" or not hw.supports("fp8"):
        return 1.0
    return _gemm_rate(hw, "fp8", run.training.gemm_kernel) / _gemm_rate(hw, "bf16")


def dtype_speedup(run: RunConfig, measured_dtype: str) -> float:
    """Achievable bf16 / ``measured_dtype`` GEMM throughput of the target profile: how much faster the target
    runs in bf16 what was timed in ``measured_dtype`` (fp32 on a device without native bf16); 1 for bf16."""
    if measured_dtype == "bf16":
        return 1.0
    hw = run.cluster.hardware
    return _gemm_rate(hw, "bf16") / _gemm_rate(hw, measured_dtype)


def dtype_note(run: RunConfig, measured_dtype: str) -> str:
    """Where the bf16/measured ratio comes from ('' when the layers ran in bf16)."""
    if measured_dtype == "bf16":
        return ""
    hw = run.cluster.hardware
    peaks = hw.peak_flops_per_s
    return (f"layers timed in {measured_dtype}, priced as the target's bf16 by {hw.name}'s achievable GEMM "
            f"throughput ratio bf16/{measured_dtype} = peak {peaks['bf16'] / 1e12:,.4g}/{peaks[measured_dtype] / 1e12:,.4g} "
            f"TFLOP/s (profile compute.peak_tflops) at equal efficiency = {dtype_speedup(run, measured_dtype):.3g}x: "
            f"GEMM ops, attention core and the output layer divided by it, element-wise ops kept as measured")


class Bencher:
    """Measures layer specs on the local device through the on-disk cache (imports torch)."""

    def __init__(self, *, cache_dir: str | None = None, use_cache: bool = True, warmup: int = 2, repeats: int = 7,
                 per_op: bool = True, device: str | None = None, stat: str = "median", refresh: bool = False,
                 dtype: str = "auto") -> None:
        """``refresh``: measure even what the cache holds (and write the new timing over it); ``dtype``: what
        the layers are timed in, 'auto' = bf16 where the device runs it natively, else fp32 (oracle.benchmark.dtype)."""
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - torch is a dependency of benchmark mode
            raise BenchmarkError("benchmark mode needs torch (pip install torch)") from exc
        from oracle.benchmark import timing
        from oracle.benchmark.cache import MeasurementCache
        from oracle.benchmark.dtype import choose_dtype
        self._timing = timing
        self.device = torch.device(device) if device else timing.default_device()
        self.compute = choose_dtype(self.device, dtype)
        self.settings = timing.TimingSettings(warmup=warmup, repeats=repeats, per_op=per_op, stat=stat,
                                              compute_dtype=self.compute.dtype)
        self.cache = MeasurementCache(cache_dir) if use_cache else None
        self.device_name = timing.device_name(self.device)
        self.versions = timing.software_versions()
        self.measured: list[str] = []
        self.refresh = refresh
        # on a CPU device others' load is the device's; a GPU's timings do not hang on the host's other cores
        self.monitor = LoadMonitor(need_cores=torch.get_num_threads()) if self.device.type == "cpu" else None
        self.busy: list[str] = []
        """Layers measured while other processes used the machine (not cached: see oracle.benchmark.load)."""

    def measure(self, spec: LayerSpec) -> Measurement:
        settings = dataclasses.asdict(self.settings)
        key = None
        if self.cache is not None:
            key = self.cache.key(self.device_name, self.versions, spec.key(), settings)
            hit = None if self.refresh else self.cache.get(key)
            if hit is not None:
                return hit
        if self.monitor is None:
            m, seen = self._timing.measure_spec(spec, device=self.device, settings=self.settings), None
        else:
            m, seen = self.monitor.measure(lambda: self._timing.measure_spec(spec, device=self.device,
                                                                             settings=self.settings))
        self.measured.append(spec.label())
        if seen is not None and seen.busy:
            self.busy.append(f"{spec.label()} ({seen.text()})")
        elif self.cache is not None and key is not None:
            self.cache.put(key, m, {"device": self.device_name, "versions": self.versions, "spec": spec.key(),
                                    "settings": settings})
        return m


@dataclasses.dataclass(frozen=True, slots=True)
class _Scaled:
    raw: Measurement
    f_s: float
    b_s: float
    w_s: float
    attn_f_s: float
    factor: float
    """Upscaled / measured compute (TP/ETP rescale and fp8 GEMM speed-up combined)."""


class MeasuredLayerModel:
    """LayerModel interface (layer / embedding / output) over measured times; comm from the analytical model."""

    def __init__(self, layout: Layout, comm: Any, source: "BenchmarkSource") -> None:
        self.L, self.comm, self.src = layout, comm, source
        self.run = layout.run
        self.sim = LayerModel(layout, comm)
        self.plan = source.plan(self.run)
        self.fp8 = fp8_speedup(self.run)
        self.half = {"": 1.0}
        """bf16 / measured-dtype throughput per measured dtype (dtype_speedup)."""
        self.scaled: dict[tuple[str, int | None], _Scaled] = {}
        self._anchor_times: dict[str, dict[str, float]] | None = None

    def anchor_times(self) -> dict[str, dict[str, float]]:
        """The source's anchors for this run, looked up once per projection (not once per layer type)."""
        if self._anchor_times is None:
            self._anchor_times = self.src.anchor_times(self.run)
        return self._anchor_times

    def _dtype_speedup(self, m: Measurement) -> float:
        """How much faster the target's bf16 runs than the dtype ``m`` was timed in (1 for bf16)."""
        if m.dtype not in self.half:
            self.half[m.dtype] = dtype_speedup(self.run, m.dtype)
        return self.half[m.dtype]

    def _op_factor(self, op: str, half: float = 1.0) -> float:
        """Upscale factor of one measured op: TP/ETP share, fp8 GEMM speed-up, and ``half`` (the bf16 / measured
        dtype ratio) on the matmul ops (GEMMs and the attention core)."""
        f = 1.0
        if op in EXPERT_OPS:
            f *= self.plan.etp_compute_scale
        elif op not in REPLICATED_OPS:
            f *= self.plan.tp_compute_scale
        if op in GEMM_OPS:
            f /= self.fp8 * half
        elif op in MATMUL_OPS:
            f /= half
        return f

    def _scale(self, kind: str, window: int | None) -> _Scaled:
        key = (kind, window)
        hit = self.scaled.get(key)
        if hit is not None:
            return hit
        m = self.src.get(layer_spec(self.run.model, self.run, self.plan, kind, window))
        half = self._dtype_speedup(m)
        if m.ops:
            raw = sum(o.total_s for o in m.ops.values())
            up = sum(o.total_s * self._op_factor(k, half) for k, o in m.ops.items())
            factor = up / raw if raw > 0 else self.plan.tp_compute_scale
            attn = m.ops["attn_core"].f_s * self._op_factor("attn_core", half) if "attn_core" in m.ops else 0.0
        else:
            # no per-op times: the whole layer takes the TP factor, the fp8 speed-up and the dtype ratio (an
            # upper bound on their gain: element-wise ops do not speed up with them)
            factor, attn = self.plan.tp_compute_scale / (self.fp8 * half), 0.0
        s = _Scaled(m, m.f_s * factor, m.b_s * factor, m.w_s * factor, attn, factor)
        self.scaled[key] = s
        return s

    def _anchored(self, comm: dict[str, CommPart]) -> dict[str, CommPart]:
        """Target comm anchored to the benchmark's measured collectives: TP by the ratio form, EP by the delta
        form (App. B.2); unchanged where nothing was measured."""
        out = dict(comm)
        for name, a in self.anchor_times().items():
            part = out.get(name)
            if part is None:
                continue
            if name == "tp" and a["analytical_bench_s"] > 0:
                r = a["measured_s"] / a["analytical_bench_s"]
                out[name] = CommPart(part.f_total_s * r, part.f_exposed_s * r, part.b_total_s * r, part.b_exposed_s * r,
                                     part.algorithm)
            elif name == "ep_a2a":
                d = 2 * (a["measured_s"] - a["analytical_bench_s"])  # dispatch + combine, each direction
                out[name] = CommPart(max(0.0, part.f_total_s + d), max(0.0, part.f_exposed_s + d),
                                     max(0.0, part.b_total_s + d), max(0.0, part.b_exposed_s + d), part.algorithm)
        return out

    def layer(self, kind: str, window: int | None = None) -> LayerCost:
        s = self._scale(kind, window)
        c = self.sim.layer(kind, window)
        # measured compute replaces the analytical; collectives stay analytical at the target; the MoE
        # dispatcher's host sync is inside the measured forward (framework overhead is measured, Sec. 3.1)
        extra: dict[str, Any] = {f: 0.0 for f in ("host_f_s", "host_b_s") if hasattr(c, f)}
        if hasattr(c, "ops"):
            extra["ops"] = ()  # the analytical op graph's prices do not describe a measured layer
        comm = self._anchored(c.comm)
        a2a = comm.get("ep_a2a")
        if a2a is not None and self.run.training.moe_a2a_overlap:
            # the merged forward/backward hides each direction behind the other's measured compute
            comm["ep_a2a"] = dataclasses.replace(a2a, f_exposed_s=self.sim.overlapped_a2a_s(a2a.f_total_s, s.b_s + s.w_s),
                                                 b_exposed_s=self.sim.overlapped_a2a_s(a2a.b_total_s, s.f_s))
        return dataclasses.replace(c, f_s=s.f_s, b_s=s.b_s, w_s=s.w_s, attn_f_s=s.attn_f_s or c.attn_f_s,
                                   comm=comm, **extra)

    def embedding(self) -> tuple[float, float]:
        m = self.src.get(layer_spec(self.run.model, self.run, self.plan, "embedding"))
        return m.f_s, m.b_s

    def output(self) -> tuple[float, float, float]:
        m = self.src.get(layer_spec(self.run.model, self.run, self.plan, "output"))
        k = self.plan.tp_compute_scale / self._dtype_speedup(m)  # the logits GEMM stays bf16 under fp8
        return m.f_s * k, m.b_s * k, m.w_s * k


class BenchmarkSource(LayerTimeSource):
    """Measured layer times (benchmark mode). ``timings`` (spec key -> Measurement or its dict) are used as
    given; missing ones are measured by ``bencher`` (created on first need unless ``measure=False``)."""

    name = "benchmark"
    tag = "measured"
    mode = "benchmark"

    def __init__(self, *, benchmark_gpus: int = 1, timings: Mapping[str, Any] | None = None,
                 bencher: Bencher | None = None, measure: bool = True, bencher_options: Mapping[str, Any] | None = None
                 ) -> None:
        if benchmark_gpus < 1:
            raise BenchmarkError(f"benchmark_gpus={benchmark_gpus} must be >= 1")
        self.benchmark_gpus = int(benchmark_gpus)
        self.timings: dict[str, Measurement] = {k: v if isinstance(v, Measurement) else Measurement.from_dict(v)
                                                for k, v in (timings or {}).items()}
        self._bencher = bencher
        self._measure = measure
        self._bencher_options = dict(bencher_options or {})
        self.collective_times: dict[str, float] = {}
        """Measured collectives of benchmark layouts (CollectiveSpec key -> seconds)."""

    def __getstate__(self) -> dict[str, Any]:  # travels to device actors without its torch state
        d = dict(self.__dict__)
        d["_bencher"] = None
        return d

    # ------------------------------------------------------------------ measurements
    @property
    def bencher(self) -> Bencher:
        if self._bencher is None:
            self._bencher = Bencher(**self._bencher_options)
        return self._bencher

    def plan(self, run: RunConfig) -> BenchPlan:
        return downscale(run, self.benchmark_gpus)

    def specs(self, run: RunConfig) -> dict[tuple[str, int | None], LayerSpec]:
        return run_layer_specs(run, self.plan(run))

    def get(self, spec: LayerSpec) -> Measurement:
        key = spec.key()
        m = self.timings.get(key)
        if m is None:
            if not self._measure:
                raise BenchmarkError(f"no measurement of {spec.label()} (shape {key})")
            m = self.timings[key] = self.bencher.measure(spec)
        return m

    def anchor_times(self, run: RunConfig) -> dict[str, dict[str, float]]:
        """Measured vs modelled benchmark-layout collectives ('tp', 'ep_a2a'), measuring them on first need
        when the benchmark has more than one device; {} with one device (nothing is measurable)."""
        plan = self.plan(run)
        anchors = _anchors(run, plan)
        if not anchors or plan.gpus < 2:
            return {}
        from oracle.projector import comm_model
        specs = {name: _collective_spec(a) for name, a in anchors.items()}
        missing = [s for s in specs.values() if s.key() not in self.collective_times]
        if missing:
            if not self._measure:
                return {}
            from oracle.benchmark.collectives import measure_collectives
            self.collective_times.update(measure_collectives(missing, plan.gpus))
        cm = comm_model(run.cluster.hardware, plan.gpus)
        return {name: {"measured_s": self.collective_times[specs[name].key()],
                       "analytical_bench_s": cm.cost(a.kind, a.group, a.model_nbytes).time_s,
                       "collective": specs[name].key(), "form": "ratio" if name == "tp" else "delta"}
                for name, a in anchors.items()}

    # LayerTimer protocol (raytune_primus.actors): shapes are spec keys, a measurement is a plain dict
    def shapes(self, run: RunConfig) -> list[str]:
        return [s.key() for s in self.specs(run).values()]

    def measure(self, shape: str, gpu_ids: Any = ()) -> dict[str, Any]:
        return self.get(LayerSpec.from_key(shape)).to_dict()

    def with_timings(self, timings: Mapping[str, Any]) -> "BenchmarkSource":
        new = BenchmarkSource(benchmark_gpus=self.benchmark_gpus, timings={**self.timings, **timings},
                              measure=False)
        new.collective_times = dict(self.collective_times)
        return new

    def memory(self, run: RunConfig) -> Any:
        from oracle.memory import project_memory
        return project_memory(run, trees="none")

    def score(self, run: RunConfig) -> Any:
        """Evaluator interface (searchers): the benchmark projection of ``run``; a layer that cannot be
        measured raises BenchmarkError, which a search records as a failed trial."""
        return self.project(run)

    # ------------------------------------------------------------------ LayerTimeSource
    def layer_model(self, L: Layout, comm: Any) -> MeasuredLayerModel:
        return MeasuredLayerModel(L, comm, self)

    def optimizer_rate_s_per_param(self, run: RunConfig) -> float | None:
        """Adam step seconds per parameter, measured on a parameter shard of the size the target's ranks hold
        (paper Sec. 3.1: the optimizer step is measured on the benchmark, falling back to the analytical model)."""
        return self.get(self.specs(run)[("optimizer", None)]).optimizer_s_per_param

    def _measured_optimizer(self, run: RunConfig, proj: Any) -> Any:
        """``proj`` with the analytical optimizer step replaced by the measured rate x the critical rank's shard."""
        from oracle.memory import rank_param_counts
        rate = self.optimizer_rate_s_per_param(run)
        if rate is None:
            return proj
        t = run.training
        L = Layout(run)
        dense_p, expert_p = rank_param_counts(run, proj.details["critical_rank"])
        sharded = t.use_distributed_optimizer or t.fsdp
        params = dense_p / (L.dp * t.cp) if sharded else dense_p
        params += expert_p / L.edp if sharded else expert_p
        bd = proj.breakdown
        opt_s = rate * params
        it = proj.iteration_time_s - bd.optimizer_s + opt_s
        k = proj.iteration_time_s / it
        bd = dataclasses.replace(bd, optimizer_s=opt_s, sources={**bd.sources, "optimizer": "measured"})
        return dataclasses.replace(proj, iteration_time_s=it, tokens_per_s_per_gpu=proj.tokens_per_s_per_gpu * k,
                                   tflops_per_gpu=proj.tflops_per_gpu * k, mfu=proj.mfu * k, breakdown=bd)

    def project(self, run: RunConfig, timings: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        """Projection of ``run`` from measured layers, with ``details['benchmark']``: the downscale plan,
        each measured layer and its upscale factor, and every analytical term added on top."""
        src = self.with_timings(timings) if timings else self
        proj = src._measured_optimizer(run, project(run, mode="benchmark", source=src, **kw))
        proj.details["benchmark"] = src.report(run, proj)
        return proj

    def report(self, run: RunConfig, proj: Any) -> dict[str, Any]:
        plan = self.plan(run)
        lm = MeasuredLayerModel(Layout(run), None, self)
        layers = {}
        for (kind, window), spec in self.specs(run).items():
            if kind == "optimizer":
                continue
            m = self.get(spec)
            entry: dict[str, Any] = {"shape": spec.label(), "measured_f_s": m.f_s, "measured_b_s": m.b_s,
                                     "measured_w_s": m.w_s, "device": m.device, "spread": m.spread,
                                     "dtype": spec.dtype, "measured_dtype": m.dtype or spec.dtype}
            if kind in ("dense", "moe"):
                s = lm._scale(kind, window)
                entry.update(upscale_factor=s.factor, f_s=s.f_s, b_s=s.b_s, w_s=s.w_s,
                             ops={k: {"f_s": o.f_s, "b_s": o.b_s, "w_s": o.w_s} for k, o in m.ops.items()})
            layers[f"{kind}" + (f"/window={window}" if window else "")] = entry
        bd = proj.breakdown
        comm = {c.kind: {"total_s": c.total_s, "exposed_s": c.exposed_s} for c in bd.comm}
        devices = sorted({e["device"] for e in layers.values() if e["device"]})
        measured_dtypes = sorted({e["measured_dtype"] for e in layers.values()})
        return {
            "plan": plan.to_dict(),
            "devices": devices,
            "target_hardware": run.cluster.hardware.name,
            "device_note": (f"measured on {', '.join(devices) or 'no device'}, used as {run.cluster.hardware.name} "
                            f"kernel times (benchmark mode assumes the benchmark device is the target's, Sec. 3.1)"),
            "layers": layers,
            "fp8_gemm_speedup": fp8_speedup(run),
            "fp8_note": ("fp8 GEMMs timed in bf16 and divided by the profile's fp8/bf16 achievable GEMM "
                         "throughput ratio") if run.training.precision == "fp8" else "",
            "measured_dtypes": measured_dtypes,
            "dtype_speedup": {d: dtype_speedup(run, d) for d in measured_dtypes},
            "dtype_note": "; ".join(n for n in (dtype_note(run, d) for d in measured_dtypes) if n),
            "compute_dtype": self._bencher.compute.to_dict() if self._bencher is not None else None,
            "load": self._bencher.monitor.summary() if self._bencher is not None and self._bencher.monitor else None,
            "busy_layers": list(self._bencher.busy) if self._bencher is not None else [],
            "collectives": self.anchor_times(run),
            "upscale": {
                "measured_compute_s": bd.compute_s,
                "pp_bubble_s": bd.bubble_s,
                "pp_note": f"target schedule {run.training.schedule} re-simulated from measured layer times"
                           if run.training.pp > 1 else "",
                "tp_compute_scale": plan.tp_compute_scale,
                "etp_compute_scale": plan.etp_compute_scale,
                "ep_a2a_delta_s": comm.get("ep_a2a", {}).get("exposed_s", 0.0),
                "tp_comm_s": comm.get("tp", {}).get("exposed_s", 0.0),
                "comm_terms": comm,
                "note": ("collectives of the benchmark layout measured on its devices anchor the model: TP by the "
                         "ratio form, EP by the delta form (App. B.2); every other comm term is analytical at the target"
                         if self.anchor_times(run) else
                         "no collective is measured (one benchmark device, or nothing in scope), every comm term is "
                         "the analytical model's at the target (A2A(bench) = 0, so the EP delta is the whole target A2A)"),
            },
            "optimizer_s": bd.optimizer_s,
        }


def _collective_spec(a: _Anchor) -> Any:
    from oracle.benchmark.collectives import CollectiveSpec
    return CollectiveSpec(kind=a.kind, group_size=a.group.size, nbytes=int(a.per_rank_nbytes))
