"""``ray job submit`` end to end: a Ray head on 127.0.0.1, a tiny experiment, the ledger checked.

The head runs in its own process group with its own temp dir and its own free ports, so it neither
meets the cluster fixture nor anybody else's Ray on this machine; it is stopped by killing that
process group (never ``ray stop`` or a kill by name, which would hit every Ray here). The temp dir
is short and under /tmp: Ray's unix socket paths must stay under 107 characters, which a pytest
``tmp_path`` would exceed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PACKAGES = ("oracle", "searchers", "raytune_primus", "hardware", "experiments")


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _env() -> dict[str, str]:
    from raytune_primus.runtime import ray_environment
    env = ray_environment()
    env.pop("RAY_ADDRESS", None)
    env["RAY_AUTH_MODE"] = "disabled"  # the token trap: never inherit a token mode here
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # the job's `python` is this venv's
    return env


def _our_leftovers(marker: str) -> list[int]:
    """PIDs whose command line names our head's temp dir (a targeted check, not a kill by name)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker in (d / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.fixture
def ray_head(tmp_path):
    temp_dir = tempfile.mkdtemp(prefix="rpj-", dir="/tmp")
    gcs, dash, client, nm, om, agent, agent_grpc, rt_env, metrics = _free_ports(9)
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
           "--dashboard-host=127.0.0.1", "--num-cpus=2", "--disable-usage-stats", f"--temp-dir={temp_dir}",
           f"--port={gcs}", f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
           f"--node-manager-port={nm}", f"--object-manager-port={om}", f"--dashboard-agent-listen-port={agent}",
           f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={rt_env}",
           f"--metrics-export-port={metrics}"]
    log = open(tmp_path / "head.log", "w")
    head = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.time() + 180  # a loaded 2-core VM has taken over 90 s to bring the head up
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/version", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if head.poll() is not None or time.time() > deadline:
                raise AssertionError(f"Ray head did not come up:\n{(tmp_path / 'head.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        stop_t0 = time.time()
        for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(head.pid, sig)  # the head's own process group only
            except ProcessLookupError:
                break
            try:
                head.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        deadline = time.time() + 10
        while _our_leftovers(temp_dir) and time.time() < deadline:
            time.sleep(0.5)
        left = _our_leftovers(temp_dir)
        print(f"head stopped in {time.time() - stop_t0:.1f} s; {len(left)} processes of it left")
        for pid in left:  # daemons of *this* head that left the group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _working_dir(tmp_path: Path) -> Path:
    """A minimal copy of the repository: the packages the job imports, nothing else."""
    wd = tmp_path / "wd"
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, wd / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return wd


def test_ray_job_submit_runs_an_experiment_and_writes_the_ledger(ray_head, tmp_path):
    from searchers.ledger import read_rows

    wd = _working_dir(tmp_path)
    results = tmp_path / "results"
    sub_id = f"primus-test-{os.getpid()}"
    t0 = time.time()
    proc = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", ray_head, "--working-dir", str(wd),
         "--submission-id", sub_id, "--", "python", "-m", "raytune_primus.jobs", "tiny-moe-h100-8",
         "--budget", "4", "--results", str(results)],
        env=_env(), capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    from ray.job_submission import JobStatus, JobSubmissionClient
    assert JobSubmissionClient(ray_head).get_job_status(sub_id) == JobStatus.SUCCEEDED
    assert "winner:" in out and "[4/4]" in out, out[-4000:]

    rows = [r for r in read_rows(results / "ledger.parquet") if r["trial_index"] >= 0]
    assert sorted(r["trial_index"] for r in rows) == list(range(4))
    assert all(r["status"] == "ok" and r["oracle_mode"] == "simulate" for r in rows)
    summary = json.loads((results / "summary.json").read_text())
    assert summary["ray"]["connection"] == "joined", "the job used the cluster it was submitted to"
    assert summary["winner"]["tokens_per_s_per_gpu"] == max(r["tokens_per_s_per_gpu"] for r in rows)
    assert summary["winner"]["projection"]["memory"]["fits"] is True
    assert (results / "best_so_far.png").stat().st_size > 0
    print(f"ray job submit round trip: {time.time() - t0:.1f} s")
