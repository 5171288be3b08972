"""Never hang on Ray (issue 13): a stale ray_current_cluster is ignored, a dead --address fails fast.

The CLI runs in subprocesses with a private ``RAY_TMPDIR`` holding a stale ``ray/ray_current_cluster``
(what a ``ray start --head`` cluster killed without ``ray stop`` leaves behind). Before the fix the
embedded runtime followed that file and retried the dead address for ~12 minutes.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raytune_primus.runtime import RayConnectError, _host_port, join_ray, ray_environment
from tests.conftest import ROOT

BOUND_S = 3.0
"""A short --connect-timeout for the tests (the default is 60 s)."""


def _dead_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_tmpdir() -> Iterator[Path]:
    """A private RAY_TMPDIR with a stale ray_current_cluster (short path: Ray's socket names are limited)."""
    d = Path(tempfile.mkdtemp(prefix="rt13-", dir="/tmp"))
    (d / "ray").mkdir()
    (d / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{_dead_port()}\n")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _cli(args: list[str], ray_tmpdir: Path, timeout_s: float = 300, **extra: str) -> subprocess.CompletedProcess:
    env = ray_environment()
    env.pop("RAY_ADDRESS", None)
    env.update({"RAY_TMPDIR": str(ray_tmpdir), "PYTHONPATH": str(ROOT), **extra})
    return subprocess.run([sys.executable, "-m", "raytune_primus", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout_s)


@pytest.mark.ray
def test_tune_embedded_ignores_a_stale_ray_current_cluster(ray_tmpdir, tmp_path):
    stale = (ray_tmpdir / "ray" / "ray_current_cluster").read_text().strip()
    p = _cli(["tune", "tiny-moe-h100-8", "--budget", "3", "--results", str(tmp_path / "res"), "--quiet",
              "--format", "json"], ray_tmpdir)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout)
    assert summary["ray"]["connection"] == "embedded"
    assert summary["trials_run"] == 3 and summary["winner"] is not None
    assert stale not in p.stderr, "Ray never tried the stale address"
    assert (tmp_path / "res" / "ledger.parquet").exists()


@pytest.mark.ray
def test_tune_with_a_dead_address_fails_within_the_bound_with_one_line(ray_tmpdir, tmp_path):
    address = f"127.0.0.1:{_dead_port()}"
    t0 = time.monotonic()
    p = _cli(["tune", "tiny-moe-h100-8", "--budget", "3", "--results", str(tmp_path / "res"), "--quiet",
              "--address", address, "--connect-timeout", str(BOUND_S)], ray_tmpdir, timeout_s=120)
    took_s = time.monotonic() - t0
    assert p.returncode == 2, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"error: no Ray cluster at {address} ")
    assert "`ray start --head`" in lines[0] and "drop --address to run embedded" in lines[0]
    assert "Traceback" not in p.stderr and not (tmp_path / "res" / "ledger.parquet").exists()
    # the bound, plus the interpreter's start-up and imports on a loaded 2-core machine
    assert took_s < BOUND_S + 60, took_s


@pytest.mark.ray
def test_an_address_that_accepts_connections_but_is_not_ray_gives_up_too(ray_tmpdir, tmp_path):
    """Something listens (a plain TCP socket that never answers): ray.init itself is cut off at the bound."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        address = f"127.0.0.1:{srv.getsockname()[1]}"
        p = _cli(["compare", "tiny-moe-h100-8", "--driver", "ray", "--budget", "2", "--seeds", "1",
                  "--address", address, "--connect-timeout", str(BOUND_S)], ray_tmpdir, timeout_s=180)
    assert p.returncode == 2, p.stderr[-3000:]
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: no Ray cluster at {address} "), p.stderr[-3000:]
    assert "it accepts connections but" in errors[0] and f"within {BOUND_S:g} s" in errors[0]
    assert "Traceback" not in p.stderr


def test_join_gives_up_on_a_refused_address_without_starting_ray():
    address = f"127.0.0.1:{_dead_port()}"
    t0 = time.monotonic()
    with pytest.raises(RayConnectError) as e:
        join_ray(address, 1.0)
    assert time.monotonic() - t0 < 30
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"no Ray cluster at {address} (")
    assert "within 1 s" in msg


@pytest.mark.parametrize("address, expected", [
    ("127.0.0.1:6379", ("127.0.0.1", 6379)), ("ray://head.example:10001", ("head.example", 10001)),
    ("[::1]:6379", ("::1", 6379)), ("node-3:6380", ("node-3", 6380))])
def test_addresses_are_parsed(address, expected):
    assert _host_port(address) == expected


@pytest.mark.parametrize("address", ["nohost", "host:notaport", "host:99999", "ray://", "x" * 5000])
def test_a_malformed_address_is_one_clear_line(address):
    with pytest.raises(RayConnectError) as e:
        join_ray(address, 1.0)
    assert "is not host:port, ray://host:port, 'auto' or 'local'" in str(e.value) and len(str(e.value)) < 400


def test_auto_ignores_a_stale_recorded_address_and_uses_a_live_one(monkeypatch, ray_tmpdir, capsys):
    from ray._private import services

    from raytune_primus.runtime import _running_cluster

    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmpdir))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: set())  # other Ray clusters on this machine
    assert _running_cluster() is None
    assert "ignoring the Ray address" in capsys.readouterr().err
    with socket.socket() as srv:  # a live one (something accepts connections there)
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        live = f"127.0.0.1:{srv.getsockname()[1]}"
        (ray_tmpdir / "ray" / "ray_current_cluster").write_text(live)
        assert _running_cluster() == live
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")  # inside `ray job submit`: the job's cluster
    assert _running_cluster() == "10.1.2.3:6379"


def test_the_connect_timeout_flag_rejects_nonsense(capsys):
    from raytune_primus.cli import main

    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(SystemExit) as e:
            main(["tune", "tiny-moe-h100-8", "--connect-timeout", bad])
        assert e.value.code == 2
        assert "--connect-timeout must be a positive number of seconds" in capsys.readouterr().err


def test_token_auth_is_turned_off_only_for_an_embedded_runtime():
    env = ray_environment({"RAY_AUTH_MODE": "token", "X": "1"})
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_USAGE_STATS_ENABLED"] == "0" and env["X"] == "1"
    assert ray_environment({})["RAY_AUTH_MODE"] == "disabled"
    joining = ray_environment({}, embedded=False)  # a cluster with token auth needs the token: Ray decides
    assert "RAY_AUTH_MODE" not in joining and joining["RAY_USAGE_STATS_ENABLED"] == "0"


def test_results_of_a_batch_travel_inline_unless_the_user_says_otherwise():
    from raytune_primus.runtime import INLINE_OBJECT_BYTES
    for embedded in (True, False):
        assert ray_environment({}, embedded=embedded)["RAY_max_direct_call_object_size"] == str(INLINE_OBJECT_BYTES)
    assert ray_environment({"RAY_max_direct_call_object_size": "100"})["RAY_max_direct_call_object_size"] == "100"
    assert INLINE_OBJECT_BYTES >= 200_000, "a pool batch's results (60-120 KB) fit inline"


@pytest.mark.ray
def test_a_live_cluster_is_joined_through_the_probes(cluster, ray_tmpdir):
    """The bounded join (TCP, then the GCS, then ray.init) joins a real cluster; so does RAY_ADDRESS."""
    script = ("import ray; from raytune_primus.runtime import init_ray; "
              "how = init_ray(None, connect_timeout_s=30); "
              "print(how, len([n for n in ray.nodes() if n['Alive']]))")
    env = ray_environment()
    env.update({"RAY_TMPDIR": str(ray_tmpdir), "PYTHONPATH": str(ROOT), "RAY_ADDRESS": cluster.address})
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    import ray
    assert p.stdout.split()[-2:] == ["joined", str(len([n for n in ray.nodes() if n["Alive"]]))]


@pytest.mark.ray
def test_actors_that_cannot_be_placed_fail_within_the_bound(cluster):
    """Actor start is bounded too: an actor no node can host is an error naming the cluster, not a hang."""
    import ray

    from raytune_primus.actors import Scorer
    from raytune_primus.runtime import ActorStartError, wait_for_actors

    a = ray.remote(Scorer).options(num_cpus=0, resources={"no_such_resource": 1}).remote(None, None)
    with pytest.raises(ActorStartError) as e:
        wait_for_actors([a], "oracle scorer actor(s)", timeout_s=2)
    msg = str(e.value)
    assert msg.startswith("1 oracle scorer actor(s) did not start within 2 s (the cluster has ") and "ray status" in msg
