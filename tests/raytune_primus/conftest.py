"""One simulated multi-node Ray cluster for every Ray test of this package (started once, ~15 s).

``ray.cluster_utils.Cluster`` on this machine: a head with 2 CPUs and two worker nodes with 1 CPU
and 1 *logical* GPU each, so multi-node placement, one-trial-per-device and node loss are testable
on a CPU-only box. Tests that kill a node add their own node first and remove only that one.
"""
from __future__ import annotations

import os
import time

import pytest

from raytune_primus.runtime import EMBEDDED_ENV_DEFAULTS

for _k, _v in EMBEDDED_ENV_DEFAULTS.items():
    os.environ.setdefault(_k, _v)
GIB = 2**30


class SmallCapEvaluator:
    """The synthetic oracle with a memory cap that rejects part of the tiny space (picklable)."""

    mode = "synthetic"

    def __init__(self, cap_bytes: float = 1.6 * GIB) -> None:
        from searchers.testing import SyntheticEvaluator
        self.inner = SyntheticEvaluator()
        self.cap_bytes = cap_bytes

    def memory(self, run):
        from searchers.testing import SyntheticMemory
        m = self.inner.memory(run)
        return SyntheticMemory(peak_bytes=m.peak_bytes, cap_bytes=self.cap_bytes)

    def score(self, run):
        import dataclasses
        p = self.inner.score(run)
        return dataclasses.replace(p, memory=self.memory(run))


@pytest.fixture(scope="session")
def cluster():
    """Head (2 CPUs) + 2 worker nodes (1 CPU, 1 logical GPU, resource 'gpu_node'), driver connected."""
    import ray
    from ray.cluster_utils import Cluster

    from raytune_primus.runtime import NAMESPACE

    if ray.is_initialized():
        ray.shutdown()
    t0 = time.time()
    # a lost node is declared dead after ~5 s instead of ~15-30 s (test_faults removes one); not shorter:
    # on a loaded 2-core box a busy but healthy raylet must not miss its heartbeats
    fast_failure_detection = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                              "health_check_timeout_ms": 2000, "health_check_failure_threshold": 5}
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                                                        "resources": {"head": 1},
                                                        "_system_config": fast_failure_detection})
    for i in range(2):
        c.add_node(num_cpus=1, num_gpus=1, resources={"gpu_node": 1, f"node{i}": 1})
    c.wait_for_nodes()
    ray.init(address=c.address, namespace=NAMESPACE, log_to_driver=False, logging_level="WARNING")
    c.startup_s = time.time() - t0
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="session")
def tiny():
    from searchers.experiment import load_experiment
    return load_experiment("tiny-moe-h100-8")


@pytest.fixture(scope="session")
def small(tiny):
    """A few dozen legal points of the tiny experiment (exhaustible)."""
    restrict = {"tp": [1, 2], "pp": [1, 2], "vpp": [1, 2], "ep": [1, 2], "mbs": [1, 2],
                "pp_schedule": ["1f1b", "interleaved"], "recompute": ["none", "full"], "precision": ["bf16", "fp8"]}
    pins = {"cp": 1, "fsdp": False, "use_distributed_optimizer": True, "moe_a2a_backend": "alltoall"}
    return tiny.with_changes(name="tiny-small", restrict=restrict, pins=pins)
