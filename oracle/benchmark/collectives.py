"""Collectives of the benchmark layout, measured on ``benchmark_gpus`` local devices (paper Alg. 1, App. B.2).

With more than one benchmark device the layers' in-scope collectives can be measured instead of modelled:
the TP collective of one layer-sized activation over the benchmark's TP group, and the MoE dispatch
All-to-All over the benchmark's EP group, each timed in ``world`` processes of torch.distributed (NCCL/RCCL on
GPUs, gloo on the CPU). Upscale then anchors the model to them:

* TP, ratio form: ``AR* = AR_bench(measured) x analytical(target) / analytical(bench)``;
* EP, delta form: ``A2A* = A2A_bench(measured) + A2A(target) - A2A_bench(analytical)``.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.errors import BenchmarkError

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveSpec:
    """One collective of ``nbytes`` per rank over groups of ``group_size`` consecutive ranks."""

    kind: str
    group_size: int
    nbytes: int

    def key(self) -> str:
        return f"{self.kind}|g={self.group_size}|bytes={self.nbytes}"


def _worker(rank: int, world: int, port: int, specs_json: str, out: str, cuda: bool, repeats: int) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    from oracle.benchmark.timing import pin_to_core
    warnings.filterwarnings("ignore")  # c10d deprecation chatter, once per call
    if not cuda:
        pin_to_core(rank)
        torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    results: dict[str, float] = {}
    groups: dict[int, Any] = {}
    for d in json.loads(specs_json):
        spec = CollectiveSpec(**d)
        g = spec.group_size
        if g not in groups:  # every rank creates every group (torch.distributed requires it), in the same order
            mine = None
            for start in range(0, world, g):
                pg = dist.new_group(list(range(start, start + g)))
                if start <= rank < start + g:
                    mine = pg
            groups[g] = mine
        pg = groups[g]
        n = max(1, spec.nbytes // 2)
        x = torch.ones(n * (g if spec.kind == "reduce_scatter" else 1), dtype=torch.bfloat16, device=dev)
        if spec.kind == "all_to_all":
            n = -(-n // g) * g
            x = torch.ones(n, dtype=torch.bfloat16, device=dev)
        y = torch.empty(n * g if spec.kind == "all_gather" else n, dtype=torch.bfloat16, device=dev)

        def op() -> None:
            if spec.kind == "all_reduce":
                dist.all_reduce(x, group=pg)
            elif spec.kind == "all_gather":
                dist.all_gather_into_tensor(y, x, group=pg)
            elif spec.kind == "reduce_scatter":
                dist.reduce_scatter_tensor(y, x, group=pg)
            else:
                dist.all_to_all_single(y, x, group=pg)
        ts = []
        for i in range(3 + repeats):
            dist.barrier()
            if cuda:
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            op()
            if cuda:
                torch.cuda.synchronize(dev)
            if i >= 3:
                ts.append(time.perf_counter() - t0)
        results[spec.key()] = statistics.median(ts)
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def measure_collectives(specs: list[CollectiveSpec], world: int, *, cuda: bool | None = None,
                        repeats: int = 9) -> dict[str, float]:
    """Median seconds of each collective, measured in ``world`` local processes (one device each)."""
    import torch
    import torch.multiprocessing as mp
    if not specs:
        return {}
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if cuda and torch.cuda.device_count() < world:
        raise BenchmarkError(f"measuring collectives over {world} GPUs, but {torch.cuda.device_count()} are visible")
    for s in specs:
        if s.kind not in KINDS or world % s.group_size:
            raise BenchmarkError(f"collective {s.key()}: kind must be one of {KINDS} and the group divide {world}")
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    payload = json.dumps([{"kind": s.kind, "group_size": s.group_size, "nbytes": s.nbytes} for s in specs])
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "collectives.json")
        try:
            mp.spawn(_worker, args=(world, port, payload, out, cuda, repeats), nprocs=world, join=True)
        except Exception as exc:
            raise BenchmarkError(f"measuring collectives over {world} devices failed: {type(exc).__name__}: "
                                 f"{str(exc)[-300:]}") from exc
        return json.loads(Path(out).read_text())
