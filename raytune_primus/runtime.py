"""Starting or joining a Ray runtime, the same way everywhere (CLI, jobs, tests, benchmarks).

Ray is imported only inside these functions, so ``raytune-primus project ...`` never pays for it.

Two traps on these machines (docs/ray.md, ``../shared/NOTES-toolchain.md``) are handled here:

* ``RAY_AUTH_MODE``: after a first local ``ray.init()`` writes ``~/.ray/auth_token``, later
  ``ray start`` / ``ray job submit`` calls fail with "Missing authentication token" unless the mode
  is set explicitly; :func:`ray_environment` defaults it to ``disabled`` (a user setting wins).
* usage statistics: ``RAY_USAGE_STATS_ENABLED=0`` (no network calls).

Where to run (:func:`init_ray`):

==================  ===============================================================================
``address``         meaning
==================  ===============================================================================
``None``            ``RAY_ADDRESS`` if set (it is, inside ``ray job submit``), else an embedded Ray
``"auto"``          the cluster running on this machine, else an embedded Ray
``"local"``         always an embedded Ray (tests, ``raytune-primus tune`` by default)
anything else       that cluster (``ray://host:10001`` or ``host:6379``); failing to connect raises
==================  ===============================================================================
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

NAMESPACE = "raytune-primus"
"""Ray namespace of every named actor this package creates."""

RAY_ENV_DEFAULTS: Mapping[str, str] = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "1",
}
"""Environment every Ray process of ours starts with (user settings win)."""


def ray_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default ``os.environ``) with :data:`RAY_ENV_DEFAULTS` filled in where unset."""
    out = dict(os.environ if env is None else env)
    for k, v in RAY_ENV_DEFAULTS.items():
        out.setdefault(k, v)
    return out


def apply_ray_environment() -> None:
    """Set :data:`RAY_ENV_DEFAULTS` in this process's environment where unset (before ``import ray``)."""
    for k, v in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)


def init_ray(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None,
             resources: Mapping[str, float] | None = None, log_to_driver: bool = False,
             quiet: bool = True) -> str:
    """Start or join Ray (see the module doc); return 'joined', 'embedded' or 'already running'.

    ``num_cpus`` / ``num_gpus`` / ``resources`` apply to an embedded runtime only (logical GPUs:
    ``num_gpus=2`` on a machine without any makes one-trial-per-device testable).
    """
    apply_ray_environment()
    import ray

    if ray.is_initialized():
        return "already running"
    kwargs: dict[str, Any] = {"namespace": NAMESPACE, "log_to_driver": log_to_driver,
                              "configure_logging": True, "logging_level": "WARNING" if quiet else "INFO"}
    target = address if address is not None else os.environ.get("RAY_ADDRESS")
    if target and target != "local":
        try:
            ray.init(address=target, **kwargs)
            return "joined"
        except ConnectionError:
            if target != "auto":
                raise
    embedded: dict[str, Any] = {"include_dashboard": False}
    if num_cpus is not None:
        embedded["num_cpus"] = num_cpus
    if num_gpus is not None:
        embedded["num_gpus"] = num_gpus
    if resources:
        embedded["resources"] = dict(resources)
    # an embedded runtime must not pick up a RAY_ADDRESS meant for somebody else
    saved = os.environ.pop("RAY_ADDRESS", None) if target in (None, "local", "auto") else None
    try:
        ray.init(**embedded, **kwargs)
    finally:
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved
    return "embedded"


def cluster_cpus() -> int:
    """Logical CPUs of the alive nodes of the connected cluster (at least 1)."""
    import ray

    return max(1, int(sum(n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive"))))


def cluster_gpus() -> int:
    """Logical GPUs of the alive nodes of the connected cluster."""
    import ray

    return int(sum(n["Resources"].get("GPU", 0) for n in ray.nodes() if n.get("Alive")))


def alive_nodes() -> list[str]:
    """Node ids of the alive nodes."""
    import ray

    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
