"""Starting or joining a Ray runtime, the same way everywhere (CLI, jobs, tests, benchmarks).

Ray is imported only inside these functions, so ``raytune-primus project ...`` never pays for it.

Two traps on these machines (docs/ray.md, ``../shared/NOTES-toolchain.md``) are handled here:

* ``RAY_AUTH_MODE``: after a first local ``ray.init()`` writes ``~/.ray/auth_token``, later
  ``ray start`` / ``ray job submit`` calls fail with "Missing authentication token" unless the mode
  is set explicitly. The embedded runtime (nobody else joins it) defaults it to ``disabled``
  (:data:`EMBEDDED_ENV_DEFAULTS`; a user setting wins); joining a cluster leaves it to the user and
  Ray (a cluster with token auth needs the token), as do :func:`apply_ray_environment` and
  :func:`ray_environment` unless asked for the embedded defaults.
* usage statistics: ``RAY_USAGE_STATS_ENABLED=0`` (no network calls).

One setting for speed: task arguments and results up to :data:`INLINE_OBJECT_BYTES` travel inline
(``RAY_max_direct_call_object_size``), not through the object store.

Where to run (:func:`init_ray`):

==================  ===============================================================================
``address``         meaning
==================  ===============================================================================
``None``            ``RAY_ADDRESS`` if set (it is, inside ``ray job submit``), else an embedded Ray
``"auto"``          the cluster running on this machine, else an embedded Ray; an address left in
                    ``ray_current_cluster`` by a cluster that is gone is ignored (with a note)
``"local"``         always an embedded Ray (tests, ``raytune-primus tune`` by default)
anything else       that cluster (``ray://host:10001`` or ``host:6379``)
==================  ===============================================================================

Never hang (issue 13): the embedded runtime is started with ``address="local"``, so Ray never
follows a stale ``ray_current_cluster`` file (left behind when a ``ray start --head`` cluster dies
without ``ray stop``; Ray would retry that dead address for about 12 minutes). Joining a cluster is
bounded by ``connect_timeout_s`` (default :data:`DEFAULT_CONNECT_TIMEOUT_S`): first the address must
accept a TCP connection, then ``ray.init`` must return, both within the bound; otherwise
:class:`RayConnectError` says, in one line, that there is no Ray cluster at the address and what to do.

Exposure: the embedded runtime starts without the dashboard (no HTTP server). Ray 2.60's own gRPC
servers (GCS, raylet, workers) listen on every interface whatever ``ray.init`` is given, and
``_node_ip_address="127.0.0.1"`` is rewritten to the machine's address (measured with ``ss -ltnp``):
there is no loopback-only embedded Ray to ask for; docs/reliability.md says so.
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from oracle.errors import PrimusError

NAMESPACE = "raytune-primus"
"""Ray namespace of every named actor this package creates."""

INLINE_OBJECT_BYTES = 1 << 20
"""Largest task argument or return value Ray passes inline, in the call's own message, rather than through the
node's shared-memory object store (Ray's own default: 100 KiB). A ScoringPool batch's results take 60-120 KB: above
Ray's default a third of them went through the store, one put, one read and one free on the raylet each; inline,
the raylet's CPU in a 2-worker bulk pass halves (27 -> 12 ms a 1.4 s pass, ``benchmarks/bench_ray.py``).
Set as ``RAY_max_direct_call_object_size`` (Ray reads it in each process it starts, so on a cluster it is the
``ray start`` environment's that counts: docs/ray.md)."""

RAY_ENV_DEFAULTS: Mapping[str, str] = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "1",
    "RAY_max_direct_call_object_size": str(INLINE_OBJECT_BYTES),
}
"""Environment every Ray process of ours starts with (user settings win)."""

EMBEDDED_ENV_DEFAULTS: Mapping[str, str] = {**RAY_ENV_DEFAULTS, "RAY_AUTH_MODE": "disabled"}
"""... and an embedded (or test) runtime on this machine: token auth off (user settings win)."""

DEFAULT_CONNECT_TIMEOUT_S = 60.0
"""How long joining an existing cluster may take before :func:`init_ray` gives up."""


class RayConnectError(PrimusError):
    """An explicit Ray address did not answer within the bound (the CLI prints it, exit code 2)."""


ACTOR_START_TIMEOUT_S = 300.0
"""How long the oracle actors of a search may take to start (placed, imported, answering a ping)."""


class ActorStartError(PrimusError):
    """Actors could not be started within :data:`ACTOR_START_TIMEOUT_S` (the cluster cannot place them)."""


def wait_for_actors(actors: Any, what: str, timeout_s: float = ACTOR_START_TIMEOUT_S) -> None:
    """Block until every actor answers ``ping``; ActorStartError (they are killed) after ``timeout_s``."""
    import ray
    from ray.exceptions import GetTimeoutError

    try:
        ray.get([a.ping.remote() for a in actors], timeout=timeout_s)
    except GetTimeoutError:
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        cpus = sum(n["Resources"].get("CPU", 0) for n in nodes)
        gpus = sum(n["Resources"].get("GPU", 0) for n in nodes)
        raise ActorStartError(f"{len(actors)} {what} did not start within {timeout_s:g} s (the cluster has "
                              f"{len(nodes)} alive node(s), {cpus:g} CPUs, {gpus:g} GPUs); see `ray status`") from None


def ray_environment(env: Mapping[str, str] | None = None, *, embedded: bool = True) -> dict[str, str]:
    """``env`` (default ``os.environ``) with :data:`EMBEDDED_ENV_DEFAULTS` (``embedded``, for processes
    that start or join a Ray on this machine: tests, scripts) or :data:`RAY_ENV_DEFAULTS` filled in."""
    out = dict(os.environ if env is None else env)
    for k, v in (EMBEDDED_ENV_DEFAULTS if embedded else RAY_ENV_DEFAULTS).items():
        out.setdefault(k, v)
    return out


def apply_ray_environment(*, embedded: bool = False) -> None:
    """Set :data:`RAY_ENV_DEFAULTS` (``embedded``: :data:`EMBEDDED_ENV_DEFAULTS`) in this process's
    environment where unset (before ``import ray``)."""
    for k, v in (EMBEDDED_ENV_DEFAULTS if embedded else RAY_ENV_DEFAULTS).items():
        os.environ.setdefault(k, v)


def init_ray(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None,
             resources: Mapping[str, float] | None = None, log_to_driver: bool = False,
             quiet: bool = True, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> str:
    """Start or join Ray (see the module doc); return 'joined', 'embedded' or 'already running'.

    ``num_cpus`` / ``num_gpus`` / ``resources`` apply to an embedded runtime only (logical GPUs:
    ``num_gpus=2`` on a machine without any makes one-trial-per-device testable). Joining gives up
    after ``connect_timeout_s`` with :class:`RayConnectError`.
    """
    apply_ray_environment()
    import ray

    if ray.is_initialized():
        return "already running"
    if not (connect_timeout_s > 0 and math.isfinite(connect_timeout_s)):
        raise RayConnectError(f"connect timeout {connect_timeout_s!r} s must be a positive number of seconds")
    kwargs: dict[str, Any] = {"namespace": NAMESPACE, "log_to_driver": log_to_driver,
                              "configure_logging": True, "logging_level": "WARNING" if quiet else "INFO"}
    target = address if address is not None else os.environ.get("RAY_ADDRESS")
    if target == "auto":
        target = _running_cluster()
    if target and target != "local":
        join_ray(target, connect_timeout_s, **kwargs)
        return "joined"
    embedded: dict[str, Any] = {"include_dashboard": False}
    if num_cpus is not None:
        embedded["num_cpus"] = num_cpus
    if num_gpus is not None:
        embedded["num_gpus"] = num_gpus
    if resources:
        embedded["resources"] = dict(resources)
    # address="local": a new runtime whatever RAY_ADDRESS or a stale ray_current_cluster say; the
    # variable is also hidden from the workers this starts (they inherit the environment)
    saved = os.environ.pop("RAY_ADDRESS", None)
    apply_ray_environment(embedded=True)
    try:
        ray.init(address="local", **embedded, **kwargs)
    finally:
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved
    return "embedded"


def no_cluster_message(address: str, why: str) -> str:
    """The one line :class:`RayConnectError` carries."""
    return (f"no Ray cluster at {address} ({why}); start one with `ray start --head` or drop --address "
            f"to run embedded")


def _host_port(address: str) -> tuple[str, int]:
    """(host, port) of ``host:port``, ``ray://host:port`` or ``[v6]:port``; RayConnectError otherwise."""
    text = address if "://" in address else f"tcp://{address}"
    try:
        parts = urlsplit(text)
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or port is None:
        raise RayConnectError(f"Ray address {address[:200]!r} is not host:port, ray://host:port, 'auto' or 'local'")
    return host, port


def _accepts_connections(host: str, port: int, deadline: float) -> str | None:
    """None once ``host:port`` accepts a TCP connection before ``deadline``; else the last reason."""
    why = "nothing answered"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return why
        try:
            with socket.create_connection((host, port), timeout=min(5.0, max(0.1, left))):
                return None
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


class _JoinTimeout(BaseException):
    """Raised by the alarm; a BaseException so that Ray's own ``except Exception`` retry loops let it through."""


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise _JoinTimeout in this (main) thread after ``seconds``; a no-op in other threads."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise _JoinTimeout()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(0.01, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def join_ray(address: str, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, **init_kwargs: Any) -> None:
    """``ray.init(address=address, ...)`` that gives up after ``connect_timeout_s`` (RayConnectError).

    Ray alone retries an address that does not answer for about 12 minutes (20 tries of ~36 s,
    measured with Ray 2.60), printing "Failed to connect to GCS" lines; here the address must first
    accept a TCP connection, and ``ray.init`` must then finish, within the bound.
    """
    import ray

    deadline = time.monotonic() + connect_timeout_s
    host, port = _host_port(address)
    why = _accepts_connections(host, port, deadline)
    if why is None and "://" not in address:
        why = _gcs_answers(address, deadline)
    if why is not None:
        raise RayConnectError(no_cluster_message(address, f"{why} within {connect_timeout_s:g} s"))
    left = max(1.0, deadline - time.monotonic())
    # Ray's own retry loop for the GCS honours this budget (one try per second)
    saved = os.environ.get("RAY_gcs_server_port_wait_time_s")
    os.environ["RAY_gcs_server_port_wait_time_s"] = str(max(1, math.ceil(left)))
    try:
        with _alarm(left):
            ray.init(address=address, **init_kwargs)
    except _JoinTimeout:
        with contextlib.suppress(Exception):
            ray.shutdown()
        raise RayConnectError(no_cluster_message(
            address, f"it accepts connections but Ray did not answer within {connect_timeout_s:g} s")) from None
    except ConnectionError as exc:
        with contextlib.suppress(Exception):
            ray.shutdown()
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RayConnectError(no_cluster_message(address, first[:300])) from None
    finally:
        if saved is None:
            os.environ.pop("RAY_gcs_server_port_wait_time_s", None)
        else:
            os.environ["RAY_gcs_server_port_wait_time_s"] = saved


def _gcs_answers(address: str, deadline: float) -> str | None:
    """None once a Ray GCS at ``address`` answers a client before ``deadline``; else why not.

    The probe (a standalone GCS client, which blocks in C++ for 10 s or more when nothing answers)
    runs in a daemon thread, so the wait ends at the deadline whatever the client does. A Ray
    without that client (an internal API) skips the probe: ``ray.init`` is still cut off by the alarm.
    """
    try:
        from ray._raylet import InnerGcsClient
    except ImportError:
        return None
    left = deadline - time.monotonic()
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            InnerGcsClient.standalone(address, None, max(1, int(left * 1000)))
            outcome.append(None)
        except Exception as exc:
            outcome.append(f"it accepts connections but is not a Ray cluster: "
                           f"{(str(exc).splitlines() or [type(exc).__name__])[0][:200]}")

    t = threading.Thread(target=probe, name="primus-gcs-probe", daemon=True)
    t.start()
    t.join(max(0.0, left))
    if not outcome:
        return "it accepts connections but no Ray GCS answered"
    return outcome[0]


def _running_cluster() -> str | None:
    """The address ``"auto"`` means: RAY_ADDRESS, else a live cluster on this machine, else None.

    Ray's own lookup also returns the address recorded in ``ray_current_cluster`` when the cluster
    that wrote it is gone (killed without ``ray stop``); such an address is refused at once, and is
    ignored here with a note, so that "auto" falls back to an embedded runtime instead of retrying it.
    """
    from ray._private import services

    try:
        found = services.get_ray_address_from_environment("auto", None)
    except ConnectionError:
        return None
    if not found or found == "auto" or os.environ.get("RAY_ADDRESS"):
        return found or None
    try:
        host, port = _host_port(found)
    except RayConnectError:
        return None
    if _accepts_connections(host, port, time.monotonic() + 2.0) is None:
        return found
    print(f"note: ignoring the Ray address {found} recorded in ray_current_cluster (nothing listens there); "
          f"starting an embedded Ray", file=sys.stderr)
    return None


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
