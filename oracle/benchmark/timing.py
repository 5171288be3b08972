"""Time a layer (and each of its ops) with torch: warm-up, device synchronisation, median of repeats.

Forward is timed with autograd recording (a training forward saves activations). B is
``torch.autograd.grad`` to the layer input only, B+W to input and parameters, both on a retained graph
of the same forward; W = (B+W) - B. Runs interleave F, B, B+W so machine noise hits all three alike.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from oracle.benchmark import torch_layers as tl
from oracle.benchmark.measurement import Measurement, OpTime
from oracle.benchmark.spec import LayerSpec
from oracle.errors import BenchmarkError


@dataclass(frozen=True, slots=True, kw_only=True)
class TimingSettings:
    warmup: int = 2
    repeats: int = 7
    per_op: bool = True
    optimizer: bool = False
    """Also time Adam on this layer's own parameters (the projection times it on a rank-sized shard instead)."""
    stat: str = "median"
    """'median' of the repeats, or 'min' (a machine shared with other jobs only ever slows a run down, so
    the minimum estimates the uncontended time; the CPU end-to-end check uses it on both sides)."""

    compute_dtype: str | None = None
    """The dtype layers are timed in when it is not the spec's (fp32 on a device without native bf16; see
    oracle.benchmark.dtype); None = the spec's."""

    def pick(self, xs: list[float]) -> float:
        return min(xs) if self.stat == "min" else statistics.median(xs)


def default_device() -> torch.device:
    """CUDA (also ROCm's HIP build, which answers torch.cuda) when present, else CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu} ({torch.get_num_threads()} threads)"


def software_versions() -> dict[str, str]:
    v = {"torch": torch.__version__}
    if torch.version.cuda:
        v["cuda"] = torch.version.cuda
    if getattr(torch.version, "hip", None):
        v["hip"] = str(torch.version.hip)
    if torch.backends.cudnn.is_available() and torch.cuda.is_available():
        v["cudnn"] = str(torch.backends.cudnn.version())
    return v


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clock(device: torch.device, fn: Callable[[], object]) -> tuple[float, object]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _time_fbw(device: torch.device, forward: Callable[[], torch.Tensor], inputs: Sequence[torch.Tensor],
              params: Sequence[torch.Tensor], s: TimingSettings) -> tuple[float, float, float, float]:
    """(f, b, w, spread) of a callable whose output depends on ``inputs`` and ``params`` (``s.stat`` of the
    repeats; spread = (max - min) / median of F + backward)."""
    fs, bs, bws, tot = [], [], [], []
    need_in = [t for t in inputs if t.requires_grad]
    every = need_in + [p for p in params if p.requires_grad]
    for i in range(s.warmup + s.repeats):
        tf, out = _clock(device, forward)
        g = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)
        tb = tbw = 0.0
        if every and out.requires_grad:
            if need_in:
                tb, _ = _clock(device, lambda: torch.autograd.grad(out, need_in, g, retain_graph=True, allow_unused=True))
            # the full backward as training runs it: gradients accumulate into .grad (micro-batches add up)
            tbw, _ = _clock(device, lambda: torch.autograd.backward(out, g, inputs=every))
        del out, g
        if i >= s.warmup:
            fs.append(tf)
            bs.append(tb)
            bws.append(tbw)
            tot.append(tf + max(tb, tbw))
    med = statistics.median(tot)
    spread = (max(tot) - min(tot)) / med if med > 0 else 0.0
    b = s.pick(bs)
    # W = (B+W) - B of the chosen statistic (a statistic of per-repeat differences would be biased low by noise)
    return s.pick(fs), b, max(0.0, s.pick(bws) - b) if need_in else s.pick(bws), spread


def _layer_inputs(spec: LayerSpec, device: torch.device, dt: torch.dtype) -> list[torch.Tensor]:
    if spec.kind == "embedding":
        return [torch.randint(0, spec.vocab, (spec.mbs, spec.seq_q), device=device)]
    x = torch.randn(spec.mbs, spec.seq_q, spec.hidden, device=device, dtype=dt, requires_grad=True)
    if spec.kind == "output":
        return [x, torch.randint(0, spec.vocab, (spec.mbs, spec.seq_q), device=device)]
    return [x]


def _capture_op_inputs(layer: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> dict[str, tuple]:
    ops = tl.named_ops(layer)
    seen: dict[str, tuple] = {}
    hooks = []
    for name, mod in ops.items():
        def hook(_m, args, name=name):
            seen.setdefault(name, tuple(a.detach().clone() for a in args))
        hooks.append(mod.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            layer(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return {name: seen[name] for name in ops if name in seen}


OPTIMIZER_CHUNK = 4 * 2 ** 20
"""Elements per tensor of the synthetic parameter shard the optimizer step is timed on."""


def optimizer_params(n: int, dtype: torch.dtype, device: torch.device) -> list[torch.nn.Parameter]:
    """A synthetic parameter shard of ``n`` elements (chunks of OPTIMIZER_CHUNK) in the model dtype."""
    sizes = [OPTIMIZER_CHUNK] * (n // OPTIMIZER_CHUNK) + ([n % OPTIMIZER_CHUNK] if n % OPTIMIZER_CHUNK else [])
    return [torch.nn.Parameter(torch.zeros(k, dtype=dtype, device=device)) for k in sizes]


def _time_optimizer(device: torch.device, params: Sequence[torch.nn.Parameter], s: TimingSettings) -> float | None:
    """Adam step on fp32 master copies of ``params`` (gradient cast in, write-back into the model's dtype out),
    per parameter (caches matter: time it on a shard of the size the rank holds, see kind 'optimizer')."""
    n = sum(p.numel() for p in params)
    if n == 0:
        return None
    master = [p.detach().float().clone().requires_grad_(True) for p in params]
    grads = [torch.randn_like(p) for p in params]
    kw = {"fused": True} if device.type == "cuda" else {"foreach": True}
    opt = torch.optim.Adam(master, lr=1e-4, **kw)

    def step() -> None:
        for m, g in zip(master, grads):  # the model-dtype gradients into the fp32 master's
            m.grad = g.float()
        opt.step()
        with torch.no_grad():
            torch._foreach_copy_([p.data for p in params], master)

    times = [_clock(device, step)[0] for _ in range(s.warmup + s.repeats)][s.warmup:]
    return s.pick(times) / n


def measure_spec(spec: LayerSpec, *, device: torch.device | None = None, settings: TimingSettings | None = None
                 ) -> Measurement:
    """Build ``spec`` on ``device`` and time it; a layer that cannot be built or runs out of memory raises
    BenchmarkError naming the layer and its shape."""
    dev = device or default_device()
    s = settings or TimingSettings()
    dtype = s.compute_dtype or spec.dtype
    dt = tl.torch_dtype(dtype)
    if dt == torch.bfloat16 and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise BenchmarkError(f"{spec.label()}: {device_name(dev)} does not support bf16 (time it in fp32: --dtype fp32)")
    if spec.kind == "optimizer":
        try:
            rate = _time_optimizer(dev, optimizer_params(spec.params, dt, dev), s)
        except Exception as exc:
            kind = "out of memory" if _is_oom(exc) else f"{type(exc).__name__}: {exc}"
            raise BenchmarkError(f"{spec.label()}: {kind} on {device_name(dev)} (shape {spec.key()})") from exc
        finally:
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        return Measurement(spec_key=spec.key(), f_s=0.0, b_s=0.0, w_s=0.0, params=spec.params,
                           optimizer_s_per_param=rate, device=device_name(dev), repeats=s.repeats, dtype=dtype)
    try:
        torch.manual_seed(0)
        layer = tl.build(spec, dev, dt)
    except Exception as exc:
        if _is_oom(exc):
            raise BenchmarkError(f"{spec.label()}: out of memory building the layer on {device_name(dev)} "
                                 f"(shape {spec.key()})") from exc
        raise BenchmarkError(f"cannot build layer {spec.label()} (shape {spec.key()}): "
                             f"{type(exc).__name__}: {exc}") from exc
    try:
        inputs = _layer_inputs(spec, dev, dt)
        params = [p for p in layer.parameters() if p.requires_grad]
        f, b, w, spread = _time_fbw(dev, lambda: layer(*inputs), inputs, params, s)
        if spec.kind == "embedding":  # no input gradient: the whole backward is the weight scatter-add
            f, b, w = f, w, 0.0
        ops: dict[str, OpTime] = {}
        if s.per_op and spec.kind in ("dense", "moe"):
            for name, args in _capture_op_inputs(layer, inputs).items():
                mod = tl.named_ops(layer)[name]
                op_in = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
                of, ob, ow, _ = _time_fbw(dev, lambda mod=mod, op_in=op_in: mod(*op_in), op_in,
                                          [p for p in mod.parameters() if p.requires_grad], s)
                ops[name] = OpTime(f_s=of, b_s=ob, w_s=ow)
        opt = _time_optimizer(dev, params, s) if s.optimizer else None
        return Measurement(spec_key=spec.key(), f_s=f, b_s=b, w_s=w, ops=ops,
                           params=sum(p.numel() for p in params), optimizer_s_per_param=opt,
                           device=device_name(dev), repeats=s.repeats, spread=spread, dtype=dtype)
    except BenchmarkError:
        raise
    except Exception as exc:
        if _is_oom(exc):
            raise BenchmarkError(f"{spec.label()}: out of memory on {device_name(dev)} (shape {spec.key()}); "
                                 f"a smaller mbs or more TP/EP would fit") from exc
        raise BenchmarkError(f"timing layer {spec.label()} failed (shape {spec.key()}): "
                             f"{type(exc).__name__}: {exc}") from exc
    finally:
        del layer
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def physical_cores() -> list[int]:
    """One logical CPU per physical core this process may use (SMT siblings left out), in order."""
    allowed = sorted(os.sched_getaffinity(0))
    first: dict[tuple[str, str], int] = {}
    for cpu in allowed:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{base}/physical_package_id") as a, open(f"{base}/core_id") as b:
                key = (a.read().strip(), b.read().strip())
        except OSError:
            key = ("", str(cpu))
        first.setdefault(key, cpu)
    return sorted(first.values()) or allowed


def pin_to_core(index: int) -> None:
    """Pin this process to the ``index``-th physical core, so CPU "devices" (one core each) never share a
    core's SMT siblings; a no-op where affinity cannot be set."""
    cores = physical_cores()
    try:
        os.sched_setaffinity(0, {cores[index % len(cores)]})
    except (AttributeError, OSError):
        pass


def threads_note() -> str:
    return f"torch threads={torch.get_num_threads()} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})"
