"""The HTML report of a small real search, opened in headless Chromium (no network)."""
from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from raytune_primus.cli import main
from tests.conftest import ROOT

EXPERIMENT = ROOT / "experiments" / "tiny-moe-h100-8.yaml"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    """A real 10-trial search on the tiny-moe space (simulate oracle, in-process driver, ~2 s)."""
    results = tmp_path_factory.mktemp("tiny") / "results"
    code = main(["tune", str(EXPERIMENT), "--driver", "inprocess", "--budget", "10", "--results", str(results),
                 "--quiet", "--format", "json"])
    assert code == 0
    return results


class _Resources(HTMLParser):
    """Every src/href of a page, and the <img> tags."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []
        self.imgs = 0

    def handle_starttag(self, tag, attrs):
        self.imgs += tag == "img"
        for k, v in attrs:
            if k in ("src", "href") and v is not None:
                self.urls.append((tag, v))


def _resources(html: str) -> _Resources:
    p = _Resources()
    p.feed(html)
    return p


def test_tune_writes_the_report_with_every_figure(tuned):
    summary = json.loads((tuned / "summary.json").read_text())
    assert summary["report"] == str(tuned / "report.html") and "plot_error" not in summary
    names = {Path(p).name for p in summary["plots"]}
    # tiny-moe's baseline has pp=2, so the winner has a pipeline to draw
    assert {"best_so_far.png", "memory_stages.png", "time_breakdown.png", "throughput_memory.png",
            "prefilter.png"} <= names
    for p in summary["plots"]:
        assert Path(p).stat().st_size > 5_000
    html = (tuned / "report.html").read_text()
    res = _resources(html)
    assert res.imgs == len(summary["plots"])
    for tag, url in res.urls:  # self-contained: data: images, relative links to files that exist
        if tag == "img":
            assert url.startswith("data:image/png;base64,")
        else:
            assert "://" not in url and (tuned / url).exists(), url
    assert "<script" not in html and "@import" not in html
    w = summary["winner"]
    assert f"{w['tokens_per_s_per_gpu']:,.0f}" in html and w["key"] in html
    assert "--tensor-model-parallel-size" in html and "--parallelism.tensor_parallel_degree" in html  # the launch exports


def test_report_command_rewrites_it_and_rejects_a_non_run_dir(tuned, capsys, tmp_path):
    (tuned / "report.html").unlink()
    assert main(["report", str(tuned)]) == 0
    assert "report written to" in capsys.readouterr().out and (tuned / "report.html").exists()
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "summary.json" in err and "does not exist" in err


@pytest.mark.parametrize("text, named", [
    ('{"winner": 5', "is not valid JSON"),
    ("[]", "must be a JSON object (what tune and compare write), got a list"),
    ('{"winner": {"config": 5}}', "winner.config must be an object, got a number: 5"),
    ('{"best_so_far": "fast"}', 'best_so_far must be a list or null, got a string: "fast"'),
    (b"\xff\xfe{}", "is not UTF-8 text"),
])
def test_a_damaged_summary_is_one_clear_error_for_report_and_export(tuned, tmp_path, capsys, text, named):
    # a summary.json that is not JSON, not an object, or whose keys have other types raised JSONDecodeError,
    # AttributeError or TypeError out of export and report
    copy = tmp_path / "copy"
    shutil.copytree(tuned, copy)
    (copy / "summary.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    for argv in (["report", str(copy)], ["export", str(copy), "--to", "megatron"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and named in err and all(ln.startswith("error: ") for ln in err.splitlines())


def test_export_of_a_winner_without_its_experiment_says_what_is_missing(tmp_path, capsys):
    (tmp_path / "summary.json").write_text('{"winner": {"config": {"tp": 1}}}')  # was KeyError: 'experiment'
    assert main(["export", str(tmp_path), "--to", "megatron"]) == 2
    assert "names no experiment" in capsys.readouterr().err


def test_a_moved_results_folder_reports_its_own_ledger_and_a_damaged_calibration_is_named(tuned, tmp_path, capsys):
    copy = tmp_path / "moved"
    shutil.copytree(tuned, copy)  # summary.json still records the original folder's ledger path
    (copy / "ledger.parquet").write_bytes((copy / "ledger.parquet").read_bytes()[:300])
    assert main(["report", str(copy)]) == 2
    assert "truncated" in capsys.readouterr().err  # the copy's ledger was read, not the original's
    shutil.copy(tuned / "ledger.parquet", copy / "ledger.parquet")
    (copy / "calibration.json").write_text('{"runs": [{"run": {"nope": 1}}], "fit": {}}')
    assert main(["report", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "is not a calibration as calibrate-runs writes it (TypeError" in err and "Traceback" not in err


def _browser() -> str | None:
    return next((b for b in map(shutil.which, BROWSERS) if b), None)


def _page_requests(netlog: Path) -> list[str]:
    """URLs the page itself asked the network for (Chromium's own update/account pings excluded: the
    page's requests carry its file:// network isolation key)."""
    d = json.loads(netlog.read_text())
    start = d["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [e["params"]["url"] for e in d["events"]
            if e["type"] == start and "file://" in e.get("params", {}).get("network_isolation_key", "")]


@pytest.mark.skipif(_browser() is None, reason="no chromium binary (Debian: apt-get install chromium; "
                                               "scripts/setup.sh installs it when run as root)")
def test_report_renders_in_headless_chromium(tuned, tmp_path):
    browser = _browser()
    url = (tuned / "report.html").resolve().as_uri()
    netlog = tmp_path / "net.json"
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run(common + [f"--log-net-log={netlog}", "--dump-dom", url], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert netlog.exists() and _page_requests(netlog) == []  # nothing fetched from any network
    rendered = _resources(dom.stdout)
    summary = json.loads((tuned / "summary.json").read_text())
    assert rendered.imgs == len(summary["plots"]) >= 5
    from PIL import Image
    for tag, src in rendered.urls:  # every image is an embedded PNG that decodes; links are local files
        if tag == "img":
            assert src.startswith("data:image/png;base64,")
            png = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
            png.verify()
            assert png.size[0] > 300
        else:
            assert "://" not in src and (tuned / src).exists(), src
    shot = tmp_path / "report.png"
    run = subprocess.run(common + [f"--screenshot={shot}", "--window-size=1280,3000", url],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    log = dom.stderr + run.stderr
    failed = [line for line in log.splitlines()
              if re.search(r"Failed to load resource|net::ERR_|Not allowed to load local resource", line)]
    assert not failed, failed
    img = Image.open(shot).convert("RGB")
    assert img.size == (1280, 3000)
    colours = img.resize((320, 750)).getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 200  # figures and text, not a blank page


def test_the_netlog_check_sees_an_external_resource(tmp_path):
    """The check above can fail: a page with an http image shows up in the page's requests."""
    browser = _browser()
    if browser is None:
        pytest.skip("no chromium binary")
    page = tmp_path / "bad.html"
    page.write_text('<html><body><img src="http://127.0.0.1:9/x.png"></body></html>')
    netlog = tmp_path / "net.json"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", f"--user-data-dir={tmp_path / 'p'}",
                    f"--log-net-log={netlog}", "--dump-dom", page.as_uri()], capture_output=True, timeout=120)
    assert _page_requests(netlog) == ["http://127.0.0.1:9/x.png"]


def test_report_of_a_synthetic_oracle_run_says_what_it_left_out(tmp_path):
    """The synthetic test oracle has no memory buckets or pipeline: the page still renders the search."""
    from raytune_primus.html_report import write_report
    from raytune_primus.jobs import tune_experiment
    from searchers.experiment import load_experiment
    from searchers.testing import SyntheticEvaluator

    summary = tune_experiment(load_experiment(EXPERIMENT), tmp_path, driver="inprocess", budget=5,
                              evaluator=SyntheticEvaluator(), progress=False)
    assert "plot_error" not in summary and Path(summary["report"]).exists()
    names = {Path(p).name for p in summary["plots"]}
    assert names == {"best_so_far.png", "throughput_memory.png", "prefilter.png"}
    rep = write_report(tmp_path)
    html = rep.html.read_text()
    assert _resources(html).imgs == len(rep.plots)
    # the projector's pictures of a winner the projector did not score would mix two oracles: left out, said why
    assert "not drawn" in html and "test oracle" in rep.notes[0]
