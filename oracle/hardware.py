"""Hardware profiles: schema, units conversion and loading (human units in YAML, SI inside).

A profile YAML (see ``hardware/h100-sxm.yaml``) has these sections::

    name, vendor, arch, description
    compute:   peak_tflops {bf16, fp16, fp8, fp32 ...} (dense), num_compute_units,
               exp_tops (special-function exponentials per second, 1e12; optional: attention's softmax)
    memory:    hbm_capacity_gib, hbm_bandwidth_gb_per_s, runtime_reserved_gib,
               host_link_gb_per_s (GPU <-> host memory per direction; optional: CPU offloading)
    network:   gpus_per_node,
               scale_up  {domain_size, ranks_per_domain, topology, bandwidth_gb_per_s, latency_us}
                         (per GPU, one direction; ranks_per_domain: a job's GPUs per domain, optional)
               scale_out {bandwidth_gb_per_s, latency_us}                 (NIC bandwidth per GPU)
               inter_pod {pod_size, bandwidth_gb_per_s, latency_us}       (optional)
    efficiency: NAME: {value: X, source: "where X came from"}   (every field of Efficiency)
    sources:   free-form mapping of citations for the spec numbers
    based_on:  a bundled profile's name (optional): that profile with this file's keys laid onto it, section by
               section (an efficiency given here replaces the base's entry and needs its own source)

GB means 10^9 bytes (bandwidths), GiB means 2^30 bytes (capacities).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hardware import PROFILE_DIR
from oracle.errors import HardwareProfileError, InvalidConfigError, PrimusError, clip
from oracle.registry import YamlRegistry
from oracle.schema import unknown_key_problems
from oracle.units import GB, GIB, TFLOPS, US
from oracle.yamlio import load_mapping


DEFAULT_MEMORY_MARGIN = 0.10
"""Share of allocatable HBM held back by default (paper App. C.3 pre-filter: cap = (HBM - reserve) x 0.9)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiency:
    """Achievable fractions and overheads the simulate-mode models need (all dimensionless or SI).

    Each value in the YAML carries a ``source`` saying where it came from (a measurement, a
    vendor figure, or a fit over the validation set named there).
    """

    gemm_bf16: float
    """Max achievable fraction of dense BF16 peak for large, well-shaped GEMMs under sustained load."""
    gemm_fp8: float
    """Same for FP8 GEMMs, as a fraction of the FP8 peak (includes per-tensor scaling overheads)."""
    gemm_k_half: float
    """Reduction length K (elements) at which GEMM efficiency drops to half (pipeline fill, epilogue)."""
    attention_fwd: float
    """Achievable fraction of BF16 peak of the flash-attention forward kernel on long sequences."""
    attention_bwd: float
    """Same for the flash-attention backward kernel."""
    hbm: float
    """Achievable fraction of HBM bandwidth for memory-bound elementwise kernels."""
    scale_up_bus: float
    """Achievable fraction of scale-up (NVLink/xGMI) per-GPU bandwidth for large collectives."""
    scale_out_bus: float
    """Achievable fraction of NIC bandwidth per GPU for large inter-node collectives."""
    kernel_launch_s: float
    """Fixed per-kernel launch/synchronisation cost in seconds."""
    collective_launch_s: float
    """Fixed per-collective software overhead in seconds (NCCL/RCCL launch, proxy setup)."""
    gemm_fp4: float = 0.0
    """Same for NVFP4 GEMMs (block-scaled FP4, Blackwell), as a fraction of the FP4 peak; 0 where the
    part has no FP4 tensor cores."""
    gemm_mxfp8: float = 0.0
    """Same for MXFP8 GEMMs (FP8 with an e8m0 scale per 32 values on block-scaled tensor cores), as a
    fraction of the FP8 peak; 0 where the part runs no MXFP8 GEMMs (training.fp8_recipe=mxfp8 refused)."""
    host_op_s: float = 0.0
    """Host (CPU) time to issue one framework-level operation of the training stack in eager mode
    (Python + Megatron-Core/Transformer Engine dispatch + launch). A pass whose ops are small is
    host-bound: the GPU idles until the host has issued them (oracle.opgraph counts the ops)."""
    gemm_grouped: float = 1.0
    """Fraction of its dense kernel's efficiency a grouped GEMM (a MoE layer's local experts: Transformer Engine's
    multi-stream GroupedLinear or a fused grouped kernel) reaches: ragged groups, a prologue and epilogue per
    group, per-group scale factors. 1.0 = the same as one large GEMM."""
    grouped_gemm_overhead_s: float = 0.0
    """Device time each batch of a grouped GEMM's per-expert kernels adds beyond its tiles (Transformer Engine's
    GroupedLinear launches one GEMM per expert on GROUPED_GEMM_STREAMS streams: each batch's kernels fill and drain
    their pipelines and write their epilogues before the next batch starts); a fused grouped kernel pays it once."""
    attention_exp_overlap: float = 0.0
    """Share of the shorter of a flash-attention tile's matmul time and its softmax-exponential time that the
    kernel hides behind the longer (0: they add up; 1: max of the two). What the attention kernels of the
    part's software stack achieve (oracle.gemm.attention_time_s)."""
    alltoall_share: float = 1.0
    """Share of the collectives' scale-up bus efficiency (``scale_up_bus``) the collective library's all-to-all
    reaches (NCCL/RCCL ``all_to_all_single``: grouped pairwise send/recv through the library's p2p transport, a
    few channels per peer, instead of a ring driving every channel on one neighbour); 1.0 = the same. The flex
    dispatcher's kernels (DeepEP, HybridEP) are priced at ``scale_up_bus`` itself."""
    moe_sync_stall_s: float
    """GPU idle time per forward pass of one MoE layer while the host catches up after the token
    dispatcher's device-to-host synchronisation (token counts for the all-to-all splits and the
    grouped-GEMM sizes); zero with a sync-free MoE (``training.moe_sync_free``) or drop-and-pad
    (``training.moe_pad_expert_input_to_capacity``)."""


SM100_ARCHS = frozenset({"blackwell", "blackwell-ultra"})
"""NVIDIA architectures (``arch``) of the data-centre Blackwell parts, sm_100 / sm_103 (HardwareProfile.sm100_class)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareProfile:
    """One accelerator part and the network it ships in, in SI units."""

    name: str
    """Profile key (file name without .yaml)."""
    vendor: str
    """'nvidia', 'amd' or 'cpu'."""
    arch: str
    """Architecture label, e.g. 'hopper', 'cdna4' (the generation the calibration groups parts by)."""
    peak_flops_per_s: dict[str, float]
    """Dense peak per dtype ('bf16', 'fp16', 'fp8', 'fp32', 'fp4'); a dtype absent = unsupported."""
    num_compute_units: int
    """SMs / CUs: the number of GEMM tiles that run concurrently in one wave (one per unit)."""
    peak_exp_per_s: float = 0.0
    """Exponentials per second the special-function units compute (flash attention's softmax takes one per
    score); 0 = not given (attention priced by its matmuls alone)."""
    host_link_bytes_per_s: float = 0.0
    """GPU <-> host-memory bandwidth per direction (PCIe, NVLink-C2C); 0 = not given (CPU offloading refused)."""
    hbm_capacity_bytes: float
    """Device memory capacity."""
    hbm_bandwidth_bytes_per_s: float
    """Peak device memory bandwidth."""
    runtime_reserved_bytes: float
    """Memory taken by the runtime, CUDA/HIP context and communicator buffers before any tensor."""
    gpus_per_node: int
    """GPUs per server (one host OS)."""
    scale_up_domain_size: int
    """GPUs sharing one scale-up fabric (8 for a DGX/MI node, 72 for NVL72)."""
    scale_up_bandwidth_bytes_per_s: float
    """Per-GPU, per-direction scale-up bandwidth."""
    scale_up_latency_s: float
    """Scale-up hop latency."""
    scale_up_topology: str = "switch"
    """'switch' (NVSwitch: any subgroup gets full per-GPU bandwidth) or 'mesh' (AMD xGMI: a g-GPU
    subgroup uses only (g-1)/(domain-1) of the per-GPU links)."""
    scale_up_ranks_per_domain: int | None = None
    """Consecutive ranks of one job placed in each scale-up domain (whole hosts), when a job takes
    fewer GPUs of a domain than it has (e.g. 64 of an NVL72 rack's 72); None = ``scale_up_domain_size``."""
    scale_out_bandwidth_bytes_per_s: float
    """Per-GPU, per-direction NIC bandwidth across scale-up domains."""
    scale_out_latency_s: float
    """Scale-out hop latency."""
    pod_size: int | None
    """GPUs per pod (leaf/spine tier) beyond which the inter-pod tier applies; None = one tier."""
    inter_pod_bandwidth_bytes_per_s: float
    """Per-GPU bandwidth across pods."""
    inter_pod_latency_s: float
    """Latency across pods."""
    efficiency: Efficiency
    """Achievable-efficiency parameters, each sourced in the YAML."""
    efficiency_sources: dict[str, str] = field(default_factory=dict)
    """Where each efficiency value came from (field name -> citation)."""
    description: str = ""
    """Free text."""
    aliases: tuple[str, ...] = ()
    """Other names published tables give the part (``H100-SXM-80GB`` for h100-sxm): the registry's loose lookup."""
    sources: dict[str, Any] = field(default_factory=dict)
    """Citations for the spec numbers."""

    _hash: int = field(init=False, repr=False, compare=False)
    """Hash of the identifying scalars, computed once: the lru_cache'd kernels hash the profile per op."""

    @property
    def sm100_class(self) -> bool:
        """An NVIDIA data-centre Blackwell part, compute capability 10.x (sm_100 / sm_103: B200, GB200, B300, GB300):
        what Transformer Engine's Blackwell-only kernels check for (``get_device_compute_capability()[0] == 10``)."""
        return self.vendor.lower() == "nvidia" and self.arch in SM100_ARCHS

    @property
    def fp8_any_layout(self) -> bool:
        """FP8 GEMMs take their operands in any layout, so a per-tensor-scaled FP8 tensor needs no transposed copy
        for the backward (Transformer Engine ``is_non_tn_fp8_gemm_supported``: compute capability 10.x and 13+,
        Blackwell; Hopper and Ada take FP8 only as TN and keep a transpose)."""
        return self.sm100_class

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.name, self.num_compute_units, self.hbm_bandwidth_bytes_per_s,
                                                tuple(sorted(self.peak_flops_per_s.items())), self.efficiency,
                                                self.peak_exp_per_s)))

    def __setstate__(self, state: list[Any]) -> None:  # unpickled in another process: its own string hashes
        for f, v in zip(dataclasses.fields(self), state):
            object.__setattr__(self, f.name, v)
        self.__post_init__()

    def __hash__(self) -> int:  # dict fields: hash the identifying scalars (used by lru_cache'd kernels)
        return self._hash

    @property
    def ranks_per_scale_up_domain(self) -> int:
        """Consecutive job ranks per scale-up domain: what decides which groups stay on the scale-up tier."""
        return self.scale_up_ranks_per_domain or self.scale_up_domain_size

    def peak_flops(self, dtype: str) -> float:
        """Dense peak for ``dtype``; raises if the part has no such tensor-core path."""
        try:
            return self.peak_flops_per_s[dtype]
        except KeyError:
            raise InvalidConfigError(
                f"hardware {self.name!r} has no {dtype} peak; supported: "
                f"{', '.join(sorted(self.peak_flops_per_s))}") from None

    def supports(self, dtype: str) -> bool:
        return dtype in self.peak_flops_per_s

    @property
    def fp4_gemms(self) -> bool:
        """NVFP4 GEMMs can be priced: the part has an FP4 peak and a fitted/sourced ``gemm_fp4``."""
        return self.supports("fp4") and self.efficiency.gemm_fp4 > 0

    @property
    def mxfp8_gemms(self) -> bool:
        """MXFP8 GEMMs can be priced: the part has an FP8 peak and a sourced/fitted ``gemm_mxfp8``."""
        return self.supports("fp8") and self.efficiency.gemm_mxfp8 > 0

    def memory_cap_bytes(self, margin: float = DEFAULT_MEMORY_MARGIN) -> float:
        """Usable memory cap = (HBM - runtime reserve) x (1 - margin) (paper App. C.3: margin 0.10)."""
        return (self.hbm_capacity_bytes - self.runtime_reserved_bytes) * (1.0 - margin)


_TOP = ["name", "vendor", "arch", "description", "aliases", "compute", "memory", "network", "efficiency", "sources",
        "based_on"]
_COMPUTE = ["peak_tflops", "num_compute_units", "exp_tops"]
_MEMORY = ["hbm_capacity_gib", "hbm_bandwidth_gb_per_s", "runtime_reserved_gib", "host_link_gb_per_s"]
_NETWORK = ["gpus_per_node", "scale_up", "scale_out", "inter_pod"]
_LINKS = {"scale_up": ["domain_size", "ranks_per_domain", "topology", "bandwidth_gb_per_s", "latency_us"],
          "scale_out": ["bandwidth_gb_per_s", "latency_us"],
          "inter_pod": ["pod_size", "bandwidth_gb_per_s", "latency_us"]}
_DTYPES = ("bf16", "fp16", "fp8", "fp32", "tf32", "fp6", "fp4", "int8")
_FRACTIONS = ("gemm_bf16", "gemm_fp8", "gemm_fp4", "gemm_mxfp8", "attention_fwd", "attention_bwd", "hbm", "scale_up_bus",
              "scale_out_bus", "attention_exp_overlap", "gemm_grouped")


class _Missing(str):
    """A problem that is a missing key (``dotted``: its full name): the missing keys of one profile are
    reported together, in one line (:func:`_missing_line`)."""

    dotted: str


def _missing(where: str, key: str) -> _Missing:
    m = _Missing(f"{where}: missing {key!r}")
    m.dotted = f"{where}.{key}"
    return m


def _missing_line(where: str, data: dict, problems: list[str]) -> str:
    """One line for every missing key of a profile: what is missing (a missing section's own keys left out)
    and what a profile needs."""
    keys = [m.dotted[len(where) + 1:] for m in problems if isinstance(m, _Missing)]
    keys = [k for k in keys if not any(k.startswith(other + ".") for other in keys)]
    need = ("a profile needs sections compute (peak_tflops, num_compute_units), memory (hbm_capacity_gib, "
            "hbm_bandwidth_gb_per_s, runtime_reserved_gib), network (gpus_per_node, scale_up, scale_out) and "
            "efficiency ({value: X, source: '...'} per constant) as in hardware/h100-sxm.yaml; or give a bundled "
            "profile name (raytune-primus hardware list) or a profile YAML path")
    if not data:
        return f"{where} is an empty mapping: {need}"
    return f"{where} is incomplete, missing {', '.join(keys)}: {need}"


def _section(data: dict, key: str, where: str, problems: list[str], required: bool = True) -> dict:
    sec = data.get(key)
    if sec is None:
        if required:
            problems.append(_missing(where, key))
        return {}
    if not isinstance(sec, dict):
        problems.append(f"{where}.{key} must be a mapping, got {type(sec).__name__}")
        return {}
    return sec


def _finite(v: int | float) -> bool:
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _num(sec: dict, key: str, where: str, problems: list[str], *, positive: bool = True,
         required: bool = True, integer: bool = False) -> float | None:
    if key not in sec or sec[key] is None:
        if required:
            problems.append(_missing(where, key))
        return None
    v = sec[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        problems.append(f"{where}.{key}={clip(repr(v), 80)} must be a number")
        return None
    if not _finite(v):  # NaN, inf, or an integer beyond any float
        problems.append(f"{where}.{key}={clip(repr(v), 80)} must be a finite number")
        return None
    if integer and not float(v).is_integer():
        problems.append(f"{where}.{key}={v!r} must be a whole number")
        return None
    if positive and v <= 0:
        problems.append(f"{where}.{key}={v!r} must be > 0")
        return None
    if not positive and v < 0:
        problems.append(f"{where}.{key}={v!r} must be >= 0")
        return None
    return float(v)


def _merged(base: Any, over: Any) -> Any:
    """``over`` laid onto ``base``: mappings key by key (recursively), anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merged(base.get(k), v) if k in base else v for k, v in over.items()}}
    return over


def _based_on(data: dict[str, Any], where: str) -> dict[str, Any]:
    """A profile that names a bundled one in ``based_on``: that profile's mapping (``profile_to_dict``) with this
    one's keys laid onto it, section by section; the base's ``aliases`` are not inherited (they name the base), and
    its efficiency sources come along with its values (a value given here needs its own source)."""
    ref = data["based_on"]
    if not isinstance(ref, str) or not ref.strip():
        raise HardwareProfileError(f"{where}.based_on={clip(repr(ref), 80)} must name a bundled hardware profile; "
                                   f"valid: {', '.join(bundled_hardware())}")
    if ref.strip() not in bundled_hardware() and (ref.strip().endswith((".yaml", ".yml")) or "/" in ref):
        raise HardwareProfileError(f"{where}.based_on={ref!r} must name a bundled hardware profile, not a file "
                                   f"(valid: {', '.join(bundled_hardware())})")
    try:
        base = profile_to_dict(load_hardware(ref.strip()))
    except PrimusError as exc:  # an unknown name: which key named it, then the registry's list and guesses
        raise HardwareProfileError(f"{where}.based_on: {exc}") from None
    base.pop("aliases", None)
    base["description"] = f"based on {base['name']}: {base.get('description', '')}"
    base.pop("name", None)  # this profile's own name (the file's), never the base's
    over = {k: v for k, v in data.items() if k != "based_on"}
    merged = _merged(base, over)
    eff = over.get("efficiency")
    if isinstance(eff, dict) and isinstance(merged.get("efficiency"), dict):
        # an efficiency given here replaces the base's entry whole: its value never takes the base's source
        merged["efficiency"] = {**base.get("efficiency", {}), **eff}
    return merged


def profile_from_dict(data: dict[str, Any], name: str, where: str | None = None) -> HardwareProfile:
    """Parse and validate a profile mapping (human units) into a :class:`HardwareProfile` (one with ``based_on: NAME``
    is that bundled profile with this mapping's keys laid onto it: :func:`_based_on`)."""
    where = where or f"hardware profile {name!r}"
    if not isinstance(data, dict):
        raise HardwareProfileError(f"{where} must be a mapping, got a {type(data).__name__}")
    if "based_on" in data:
        data = _based_on(data, where)
    p: list[str] = unknown_key_problems(data, _TOP, where)
    if "sources" in data and not isinstance(data["sources"], (dict, type(None))):
        p.append(f"{where}.sources must be a mapping of label -> citation, got a {type(data['sources']).__name__}")
    aliases = data.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
        p.append(f"{where}.aliases must be a list of names (strings), got {clip(repr(aliases), 80)}")
        aliases = []
    comp = _section(data, "compute", where, p)
    mem = _section(data, "memory", where, p)
    net = _section(data, "network", where, p)
    eff = _section(data, "efficiency", where, p)
    p += unknown_key_problems(comp, _COMPUTE, f"{where}.compute")
    p += unknown_key_problems(mem, _MEMORY, f"{where}.memory")
    p += unknown_key_problems(net, _NETWORK, f"{where}.network")
    peaks_raw = comp.get("peak_tflops")
    peaks: dict[str, float] = {}
    if peaks_raw is None:
        p.append(_missing(f"{where}.compute", "peak_tflops"))
    elif not isinstance(peaks_raw, dict) or not peaks_raw:
        p.append(f"{where}.compute.peak_tflops must be a mapping like {{bf16: 989, fp8: 1979}}")
    else:
        for dt, v in peaks_raw.items():
            if dt not in _DTYPES:
                p.append(f"{where}.compute.peak_tflops: unknown precision {dt!r}; valid: {', '.join(_DTYPES)}")
                continue
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) or v <= 0:
                p.append(f"{where}.compute.peak_tflops.{dt}={clip(repr(v), 80)} must be a positive number")
            else:
                peaks[str(dt)] = float(v) * TFLOPS
        if "bf16" not in peaks:
            p.append(f"{where}.compute.peak_tflops needs a bf16 entry")
    ncu = _num(comp, "num_compute_units", f"{where}.compute", p, integer=True)
    exp_tops = _num(comp, "exp_tops", f"{where}.compute", p, required=False)
    host_link = _num(mem, "host_link_gb_per_s", f"{where}.memory", p, required=False)
    cap = _num(mem, "hbm_capacity_gib", f"{where}.memory", p)
    bw = _num(mem, "hbm_bandwidth_gb_per_s", f"{where}.memory", p)
    reserve = _num(mem, "runtime_reserved_gib", f"{where}.memory", p, positive=False)
    gpn = _num(net, "gpus_per_node", f"{where}.network", p, integer=True)
    links = {}
    for link, req in (("scale_up", True), ("scale_out", True), ("inter_pod", False)):
        sec = _section(net, link, f"{where}.network", p, required=req)
        p += unknown_key_problems(sec, _LINKS[link], f"{where}.network.{link}")
        links[link] = sec
    su, so, ip = links["scale_up"], links["scale_out"], links["inter_pod"]
    su_size = _num(su, "domain_size", f"{where}.network.scale_up", p, required=False, integer=True)
    topo = su.get("topology", "switch")
    if topo not in ("switch", "mesh"):
        p.append(f"{where}.network.scale_up.topology={topo!r} must be switch or mesh")
    if su_size and gpn and su_size % gpn:
        p.append(f"{where}.network.scale_up.domain_size={su_size:g} must be a whole number of nodes "
                 f"(gpus_per_node={gpn:g})")
    su_ranks = _num(su, "ranks_per_domain", f"{where}.network.scale_up", p, required=False, integer=True)
    if su_ranks and gpn and su_ranks % gpn:
        p.append(f"{where}.network.scale_up.ranks_per_domain={su_ranks:g} must be a whole number of nodes "
                 f"(gpus_per_node={gpn:g})")
    if su_ranks and su_ranks > (su_size or gpn or su_ranks):
        p.append(f"{where}.network.scale_up.ranks_per_domain={su_ranks:g} must be <= "
                 f"domain_size={su_size or gpn:g} (the GPUs one scale-up domain has)")
    su_bw = _num(su, "bandwidth_gb_per_s", f"{where}.network.scale_up", p)
    su_lat = _num(su, "latency_us", f"{where}.network.scale_up", p, positive=False)
    so_bw = _num(so, "bandwidth_gb_per_s", f"{where}.network.scale_out", p)
    so_lat = _num(so, "latency_us", f"{where}.network.scale_out", p, positive=False)
    pod = _num(ip, "pod_size", f"{where}.network.inter_pod", p, required=False, integer=True) if ip else None
    ip_bw = _num(ip, "bandwidth_gb_per_s", f"{where}.network.inter_pod", p, required=bool(ip)) if ip else None
    ip_lat = _num(ip, "latency_us", f"{where}.network.inter_pod", p, positive=False, required=bool(ip)) if ip else None

    eff_names = [f.name for f in dataclasses.fields(Efficiency)]
    p += unknown_key_problems(eff, eff_names, f"{where}.efficiency")
    eff_vals: dict[str, float] = {}
    eff_src: dict[str, str] = {}
    for fname in eff_names:
        entry = eff.get(fname)
        if entry is None and fname == "gemm_fp8" and "fp8" not in peaks:
            eff_vals[fname], eff_src[fname] = 0.0, "not applicable: no fp8 tensor cores"
            continue
        if entry is None and fname == "gemm_fp4" and "fp4" not in peaks:
            eff_vals[fname], eff_src[fname] = 0.0, "not applicable: no fp4 tensor cores"
            continue
        if entry is None and fname == "grouped_gemm_overhead_s":
            eff_vals[fname], eff_src[fname] = 0.0, "not given: grouped GEMMs cost their tiles alone"
            continue
        if entry is None and fname == "gemm_grouped":
            eff_vals[fname], eff_src[fname] = 1.0, "not given: grouped GEMMs at the dense kernels' efficiency"
            continue
        if entry is None and fname == "alltoall_share":
            eff_vals[fname], eff_src[fname] = 1.0, "not given: the all-to-all at the collectives' bus efficiency"
            continue
        if entry is None and fname == "attention_exp_overlap":
            eff_vals[fname], eff_src[fname] = 0.0, "not given: matmuls and exponentials add up"
            continue
        if entry is None and fname == "gemm_mxfp8":
            eff_vals[fname], eff_src[fname] = 0.0, "not applicable: the profile lists no MXFP8 GEMM efficiency"
            continue
        if entry is None:
            p.append(_missing(f"{where}.efficiency", fname))
            continue
        if not isinstance(entry, dict) or "value" not in entry:
            p.append(f"{where}.efficiency.{fname} must be {{value: X, source: '...'}}")
            continue
        src = entry.get("source")
        if not isinstance(src, str) or not src.strip():
            p.append(f"{where}.efficiency.{fname} needs a non-empty 'source' saying where the value came from")
        v = entry["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) or v < 0:
            p.append(f"{where}.efficiency.{fname}.value={clip(repr(v), 80)} must be a finite number >= 0")
            continue
        if fname in _FRACTIONS and v > 1:
            p.append(f"{where}.efficiency.{fname}.value={v!r} is a fraction of peak and must be <= 1")
            continue
        extra = set(entry) - {"value", "source"}
        if extra:
            p.append(f"{where}.efficiency.{fname}: unknown key(s) {', '.join(sorted(extra))}; valid: value, source")
        eff_vals[fname] = float(v)
        eff_src[fname] = str(src)
    if any(isinstance(m, _Missing) for m in p):
        p = [_missing_line(where, data, p)] + [m for m in p if not isinstance(m, _Missing)]
    if p:
        raise HardwareProfileError("\n".join(p))
    gpn_i = int(gpn)  # type: ignore[arg-type]
    return HardwareProfile(
        name=str(data.get("name", name)), vendor=str(data.get("vendor", "")), arch=str(data.get("arch", "")),
        peak_flops_per_s=peaks, num_compute_units=int(ncu),  # type: ignore[arg-type]
        peak_exp_per_s=(exp_tops or 0.0) * 1e12, host_link_bytes_per_s=(host_link or 0.0) * GB,
        hbm_capacity_bytes=cap * GIB, hbm_bandwidth_bytes_per_s=bw * GB,  # type: ignore[operator]
        runtime_reserved_bytes=reserve * GIB,  # type: ignore[operator]
        gpus_per_node=gpn_i, scale_up_domain_size=int(su_size) if su_size else gpn_i, scale_up_topology=topo,
        scale_up_ranks_per_domain=int(su_ranks) if su_ranks else None,
        scale_up_bandwidth_bytes_per_s=su_bw * GB, scale_up_latency_s=su_lat * US,  # type: ignore[operator]
        scale_out_bandwidth_bytes_per_s=so_bw * GB, scale_out_latency_s=so_lat * US,  # type: ignore[operator]
        pod_size=int(pod) if pod else None,
        inter_pod_bandwidth_bytes_per_s=(ip_bw or so_bw) * GB,  # type: ignore[operator]
        inter_pod_latency_s=(ip_lat if ip_lat is not None else so_lat) * US,  # type: ignore[operator]
        efficiency=Efficiency(**eff_vals), efficiency_sources=eff_src,
        description=str(data.get("description", "")), aliases=tuple(aliases), sources=dict(data.get("sources") or {}),
    )


def _human(x: float, unit: float) -> float:
    """SI -> the YAML's human unit, rounded to 12 significant digits so a round trip is stable."""
    return float(f"{x / unit:.12g}")


def profile_to_dict(hw: HardwareProfile) -> dict[str, Any]:
    """The profile as a YAML mapping in human units; ``profile_from_dict`` of it gives the same profile."""
    scale_up: dict[str, Any] = {"domain_size": hw.scale_up_domain_size, "topology": hw.scale_up_topology,
                                "bandwidth_gb_per_s": _human(hw.scale_up_bandwidth_bytes_per_s, GB),
                                "latency_us": _human(hw.scale_up_latency_s, US)}
    ranks = getattr(hw, "scale_up_ranks_per_domain", None)  # optional field (partial scale-up domains)
    if ranks:
        scale_up["ranks_per_domain"] = ranks
    network: dict[str, Any] = {
        "gpus_per_node": hw.gpus_per_node, "scale_up": scale_up,
        "scale_out": {"bandwidth_gb_per_s": _human(hw.scale_out_bandwidth_bytes_per_s, GB),
                      "latency_us": _human(hw.scale_out_latency_s, US)}}
    if hw.pod_size:
        network["inter_pod"] = {"pod_size": hw.pod_size,
                                "bandwidth_gb_per_s": _human(hw.inter_pod_bandwidth_bytes_per_s, GB),
                                "latency_us": _human(hw.inter_pod_latency_s, US)}
    efficiency = {f.name: {"value": getattr(hw.efficiency, f.name),
                           "source": hw.efficiency_sources.get(f.name) or "round-tripped profile"}
                  for f in dataclasses.fields(Efficiency)}
    return {"name": hw.name, "vendor": hw.vendor, "arch": hw.arch, "description": hw.description,
            **({"aliases": list(hw.aliases)} if hw.aliases else {}),
            "compute": {"peak_tflops": {k: _human(v, TFLOPS) for k, v in hw.peak_flops_per_s.items()},
                        "num_compute_units": hw.num_compute_units,
                        **({"exp_tops": _human(hw.peak_exp_per_s, 1e12)} if hw.peak_exp_per_s else {})},
            "memory": {"hbm_capacity_gib": _human(hw.hbm_capacity_bytes, GIB),
                       "hbm_bandwidth_gb_per_s": _human(hw.hbm_bandwidth_bytes_per_s, GB),
                       "runtime_reserved_gib": _human(hw.runtime_reserved_bytes, GIB),
                       **({"host_link_gb_per_s": _human(hw.host_link_bytes_per_s, GB)}
                          if hw.host_link_bytes_per_s else {})},
            "network": network, "efficiency": efficiency, "sources": dict(hw.sources)}


def _parse_bundled(path: Path, name: str) -> HardwareProfile:
    return profile_from_dict(load_mapping(path, "hardware profile"), name)


def _parse_path(path: Path) -> HardwareProfile:
    return profile_from_dict(load_mapping(path, "hardware profile"), path.stem,
                             where=f"hardware profile {str(path)!r}")


_REGISTRY: YamlRegistry[HardwareProfile] = YamlRegistry("hardware profile", PROFILE_DIR, _parse_bundled, _parse_path)


def bundled_hardware() -> list[str]:
    """Names of the bundled profiles."""
    return _REGISTRY.names()


def bundled_hardware_name(name: str) -> str | None:
    """The bundled profile a loose spelling names (case, punctuation, aliases: ``H100``), or None; reads no profile
    (the aliases only)."""
    return _REGISTRY.resolve(name)


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A bundled profile by name, or a profile YAML by path."""
    return _REGISTRY.load(name_or_path)
