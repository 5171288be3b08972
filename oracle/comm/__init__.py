"""Communication model: topology domains from the rank layout, and alpha-beta costs of collectives.

Three domains, innermost first (``TIERS``):

* ``scale_up``  -- GPUs on one NVLink/NVSwitch or xGMI fabric (8 per HGX/MI node, 72 per NVL72 rack);
* ``scale_out`` -- the NIC fabric inside a pod (one NIC per GPU, rail-optimised);
* ``inter_pod`` -- beyond ``pod_size`` GPUs (spine/core tier).

Which domains a group crosses is decided from its rank layout (``GroupSpec.size`` ranks spaced
``stride`` apart, Megatron order), not from its size: a DP group of 2 with stride 8 on 8-GPU nodes has
one member per node and is priced on the NIC. Every collective is the minimum over the applicable
(algorithm x protocol) candidates of the Hockney alpha-beta form ``hops * alpha + bytes / B``:

* ``B`` per tier = profile bandwidth x the profile bus efficiency (``scale_up_bus``/``scale_out_bus``),
  derated on an AMD xGMI mesh to the links a pattern can drive (see ``Topology.bandwidth_bytes_per_s``);
* ``alpha`` per hop = the profile's tier latency (read as the Simple-protocol hop latency), scaled by the
  protocol's latency multiplier; ``collective_launch_s`` is added once per call.

Message sizes are bytes per rank as the framework sees them: all_reduce the buffer, all_gather the
OUTPUT buffer, reduce_scatter the INPUT buffer, all_to_all everything a rank sends including the
block it keeps, p2p the bytes sent. Formulas, the protocol table and worked numbers: docs/comm.md.
Pure arithmetic (no numpy/torch/ray); results are cached per (topology, collective, layout, bytes).

Modules: ``topology`` (domains, Placement), ``algorithms`` (protocol table and formulas),
``collectives`` (selection, public functions, CommModel).
"""
from oracle.comm.algorithms import ALGORITHMS, PROTOCOLS, Protocol
from oracle.comm.collectives import (BACKENDS, KINDS, ZERO, CollectiveCost, CommModel, all_gather, all_reduce,
                                     all_to_all, candidates, p2p, reduce_scatter)
from oracle.comm.topology import INTER_POD, SCALE_OUT, SCALE_UP, TIERS, Placement, Topology

__all__ = ["ALGORITHMS", "BACKENDS", "INTER_POD", "KINDS", "PROTOCOLS", "SCALE_OUT", "SCALE_UP", "TIERS", "ZERO",
           "CollectiveCost", "CommModel", "Placement", "Protocol", "Topology", "all_gather", "all_reduce",
           "all_to_all", "candidates", "p2p", "reduce_scatter"]
