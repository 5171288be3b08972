"""A small real trainer on CPU processes with torch.distributed over gloo: the reference that benchmark-mode
projections are checked against (not part of the oracle).

Each process is one "device" (``threads`` cores). The model is built from the same layer specs and torch
modules benchmark mode times (oracle.benchmark.torch_layers), in the dtype benchmark mode times them in (bf16
where the CPU runs it natively, else fp32: oracle.benchmark.dtype) with fp32 master weights and Adam:

* data parallel: Megatron-Core's DDP without overlap (``overlap_grad_reduce=false``): the module is called
  directly, gradients accumulate over the micro-batches, then one flat bucket is all-reduced after the last
  backward (``finish_grad_sync``). Not torch's DistributedDataParallel: its forward wrapper (~1.3 ms per
  micro-batch on a 2-core AVX2 host) and its reducer thread, which on a CPU "device" shares the core with the
  backward it is meant to hide behind, are torch's, not the Megatron mechanism the oracle prices;
* pipeline parallel: torch.distributed.pipelining stages and a real schedule (1F1B by default);
* expert parallel: the benchmarked MoE module with its dispatch and combine exchanged by all-to-all
  (autograd through the exchange), experts split across ranks; the dense parameters'
  gradients are all-reduced across the ranks after backward.

Measures tokens/s (global batch x sequence / median iteration time after warm-up).
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from oracle.benchmark import torch_layers as tl
from oracle.benchmark.spec import LayerSpec, layer_spec
from oracle.benchmark.timing import pin_to_core
from oracle.config import RunConfig
from oracle.scaling import downscale


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    """One trainer run: a config dict (RunConfig form), processes, cores per process, iterations."""

    name: str
    config: dict[str, Any]
    threads: int = 1
    warmup: int = 2
    iterations: int = 6
    stat: str = "median"
    """Iteration-time statistic: 'min' (robust to other jobs on a shared machine) or 'median'."""
    dtype: str = "bf16"
    """Compute dtype of the model ('bf16', or 'fp32' on a CPU without native bf16)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def world(self) -> int:
        return int(self.config["cluster"]["num_gpus"])


# ------------------------------------------------------------------------------------ model pieces
class _AllToAll(torch.autograd.Function):
    """Equal-split all-to-all along dim 0 whose backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(g)
        dist.all_to_all_single(out, g.contiguous())
        return out


def ep_moe(spec: LayerSpec) -> tl.MoE:
    """The benchmarked MoE module (oracle.benchmark.torch_layers.MoE) with its dispatch and combine routed
    through an all-to-all over the ``spec.ep_ranks`` processes: balanced dispatch (token copy p -> slot
    p % (ranks x local experts)), the owner's grouped GEMMs on its local experts, score-weighted combine."""
    pairs, slots = spec.tokens * spec.topk, spec.experts * spec.ep_ranks
    if pairs % slots:
        raise ValueError(f"tokens x topk = {pairs} must divide evenly over {slots} experts for the EP trainer")
    moe = tl.MoE(spec)
    moe.set_exchange(_AllToAll.apply)
    return moe


class Head(nn.Module):
    """Final norm + logits (the pipeline's last stage output; the loss is the schedule's loss_fn)."""

    def __init__(self, out: tl.OutputLoss) -> None:
        super().__init__()
        self.final_norm, self.logits = out.final_norm, out.logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(self.final_norm(x))


class Stage(nn.Module):
    """Embedding (first stage), decoder layers, head (last stage)."""

    def __init__(self, emb: nn.Module | None, layers: list[nn.Module], head: nn.Module | None) -> None:
        super().__init__()
        self.emb, self.layers, self.head = emb, nn.ModuleList(layers), head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.emb is not None:
            x = self.emb(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x) if self.head is not None else x


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def build_stage(run: RunConfig, stage: int, dtype: str = "bf16") -> Stage:
    """The modules of pipeline stage ``stage`` of ``run`` (even layer split), EP-aware MoE layers."""
    m, t = run.model, run.training
    plan = downscale(run, run.cluster.num_gpus)  # the target layout itself: each rank's own share
    per = m.num_layers // t.pp
    idx = range(stage * per, (stage + 1) * per)
    layers = []
    for i in idx:
        window = m.sliding_window if m.uses_window(i) else None
        spec = layer_spec(m, run, plan, m.layer_kinds[i], window, dtype=dtype)
        layer = tl.DecoderLayer(spec)
        if spec.kind == "moe" and t.ep > 1:
            layer.moe = ep_moe(spec)
        layers.append(layer)
    emb = tl.Embedding(layer_spec(m, run, plan, "embedding", dtype=dtype)) if stage == 0 else None
    head = Head(tl.OutputLoss(layer_spec(m, run, plan, "output", dtype=dtype))) if stage == t.pp - 1 else None
    return Stage(emb, layers, head).to(dtype=tl.torch_dtype(dtype))


class MasterAdam:
    """Adam on fp32 master copies of the parameters, written back after each step (as benchmark mode times)."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.master = [p.detach().float().clone().requires_grad_(True) for p in params]
        self.opt = torch.optim.Adam(self.master, lr=1e-4, foreach=True)

    def step(self) -> None:
        for p, mp_ in zip(self.params, self.master):
            mp_.grad = p.grad.float() if p.grad is not None else torch.zeros_like(mp_)
        self.opt.step()
        with torch.no_grad():
            torch._foreach_copy_([p.data for p in self.params], self.master)
        for p in self.params:
            p.grad = None


# ------------------------------------------------------------------------------------ the worker
def _batches(run: RunConfig, n_micro: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    t, v = run.training, run.model.vocab_size
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, v, (n_micro * t.mbs, t.seq_len), generator=g)
    return ids, torch.roll(ids, -1, dims=1)


def worker(rank: int, job_json: str, port: int, out_path: str) -> None:
    job = json.loads(job_json)
    if int(job["threads"]) == 1:
        pin_to_core(rank)
    torch.set_num_threads(int(job["threads"]))
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    world = int(job["config"]["cluster"]["num_gpus"])
    run = RunConfig.from_dict(job["config"])
    t = run.training
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1234 + rank)
    dp = world // (t.pp * t.tp * t.cp)
    n_micro = t.gbs // (t.mbs * dp)
    stage_idx = rank if t.pp > 1 else 0
    model = build_stage(run, stage_idx, job.get("dtype", "bf16"))
    params = [p for p in model.parameters()]
    dense = [p for n, p in model.named_parameters() if "experts_" not in n]
    if dp > 1:  # data-parallel replicas start from rank 0's weights (experts: each rank's own)
        with torch.no_grad():
            for p in dense:
                dist.broadcast(p, 0)
    opt = MasterAdam(params)
    schedule = None
    if t.pp > 1:
        from torch.distributed import pipelining as pl
        stage = pl.PipelineStage(model, stage_idx, t.pp, torch.device("cpu"))
        cls = {"1f1b": pl.Schedule1F1B, "gpipe": pl.ScheduleGPipe}.get(t.schedule, pl.Schedule1F1B)
        schedule = cls(stage, n_micro, loss_fn=loss_fn)

    def step(it: int) -> None:
        ids, labels = _batches(run, n_micro, seed=it * 97 + (rank if t.pp == 1 else 0))
        if schedule is not None:
            if stage_idx == 0:
                schedule.step(ids)
            elif stage_idx == t.pp - 1:
                schedule.step(target=labels)
            else:
                schedule.step()
        else:
            for mb in range(n_micro):
                sl = slice(mb * t.mbs, (mb + 1) * t.mbs)
                # the global batch's mean loss: summing the ranks' gradients then gives its gradient
                (loss_fn(model(ids[sl]), labels[sl]) / (n_micro * dp)).backward()
            if dp > 1:  # the dense gradients (EP: experts are sharded) across the data-parallel ranks,
                grads = [p.grad for p in dense if p.grad is not None]  # one flat bucket, as Megatron's buckets
                flat = torch._utils._flatten_dense_tensors(grads)
                dist.all_reduce(flat)
                for g, r in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                    g.copy_(r)
        opt.step()

    times = []
    for it in range(int(job["warmup"]) + int(job["iterations"])):
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        step(it)
        if world > 1:
            dist.barrier()
        if it >= int(job["warmup"]):
            times.append(time.perf_counter() - t0)
    if world > 1 and t.pp == 1:  # each rank's dense weights, for run_job to compare (no collective at exit)
        with open(f"{out_path}.rank{rank}", "w") as fh:
            json.dump([float(p.detach().double().sum()) for p in dense], fh)
    if rank == 0:
        it_s = min(times) if job.get("stat") == "min" else statistics.median(times)
        with open(out_path, "w") as fh:
            json.dump({"iteration_s": it_s, "iteration_times_s": times,
                       "tokens_per_s": t.gbs * t.seq_len / it_s, "world": world, "microbatches": n_micro}, fh)
    if world > 1:
        dist.destroy_process_group()


def run_job(job: TrainJob) -> dict[str, Any]:
    """Run ``job`` in ``world`` fresh processes; returns rank 0's measurement."""
    import socket
    import tempfile

    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    payload = json.dumps({"config": job.config, "threads": job.threads, "warmup": job.warmup,
                          "iterations": job.iterations, "stat": job.stat, "dtype": job.dtype})
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        mp.spawn(worker, args=(payload, port, out), nprocs=job.world, join=True)
        with open(out) as fh:
            res = json.load(fh)
        sums = [f"{out}.rank{r}" for r in range(job.world)]
        res["replicas_in_sync"] = None
        if all(os.path.exists(p) for p in sums) and job.world > 1:
            # data-parallel replicas hold the same dense weights after every step
            seen = []
            for p in sums:
                with open(p) as fh:
                    seen.append(json.load(fh))
            res["replicas_in_sync"] = all(x == seen[0] for x in seen[1:])
        return res
