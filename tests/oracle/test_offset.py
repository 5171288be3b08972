"""Workload offset k and rank agreement against the paper's Appendix E sweeps (Sec. 4.8, Tables 10 and 21)."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.errors import InvalidConfigError
from oracle.offset import MeasuredRun, fit_offset, measured_gap, rank_agreement

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def load(name: str) -> list[MeasuredRun]:
    with (RUNS / name).open() as fh:
        return [MeasuredRun(tag=r["tag"], projected_tokens_per_s_per_gpu=float(r["projected_tokens_per_s_per_gpu"]),
                            measured_tokens_per_s_per_gpu=float(r["measured_tokens_per_s_per_gpu"]))
                for r in csv.DictReader(fh)]


# (file, Table 10: k, cv, rho, tau; Table 21: median k, max |k - median| and its tag, concordant, >9% pairs,
#  discordant measured gaps)
PAPER = [
    ("mixtral-appendix-e.csv", 1.128, 0.024, 1.000, 1.000, 1.132, 0.048, "r14_b1", 21, 10, []),
    ("qwen3-appendix-e.csv", 0.901, 0.113, 1.000, 1.000, 0.924, 0.236, "qwen_i27", 21, 10, []),
    ("gpt-oss-appendix-e.csv", 1.121, 0.054, 0.933, 0.833, 1.095, 0.140, "mbs16", 33, 27, [0.088, 0.065, 0.021]),
]


@pytest.mark.parametrize("name,k,cv,rho,tau,k_med,dev,dev_tag,conc,above,gaps", PAPER,
                         ids=[p[0].split("-appendix")[0] for p in PAPER])
def test_paper_appendix_e(name, k, cv, rho, tau, k_med, dev, dev_tag, conc, above, gaps):
    runs = load(name)
    fit = fit_offset(runs)
    assert fit.n == len(runs)
    assert fit.k == pytest.approx(k, abs=0.0006)
    assert fit.cv == pytest.approx(cv, abs=0.0006)  # population std / mean, as the paper's cv
    assert fit.k_median == pytest.approx(k_med, abs=0.0006)
    ra = rank_agreement(runs)
    assert ra.spearman == pytest.approx(rho, abs=0.0006)
    assert ra.kendall == pytest.approx(tau, abs=0.0006)
    assert ra.concordant == conc and ra.ties == 0
    assert [round(f.measured_gap, 3) for f in ra.discordant] == gaps
    assert (ra.pairs_above, ra.concordant_above) == (above, above)  # 100% concordant above 9%
    assert ra.max_k_deviation == pytest.approx(dev, abs=0.0006) and ra.max_k_deviation_tag == dev_tag
    assert ra.top1_regret == 0.0 and ra.topk_regret == 0.0


def test_mixtral_band_brackets_every_measured_run():
    runs = load("mixtral-appendix-e.csv")
    fit = fit_offset(runs)
    assert fit.k_low < fit.k_min and fit.k_high > fit.k_max  # a prediction interval is wider than the sample
    for r in runs:
        c = fit.calibrate(r.projected_tokens_per_s_per_gpu)
        assert c.low_tokens_per_s_per_gpu < r.measured_tokens_per_s_per_gpu < c.high_tokens_per_s_per_gpu
        assert abs(c.tokens_per_s_per_gpu / r.measured_tokens_per_s_per_gpu - 1) < 0.05


def test_one_run_gives_k_but_no_band():
    fit = fit_offset([MeasuredRun(tag="a", projected_tokens_per_s_per_gpu=1200.0, measured_tokens_per_s_per_gpu=1000.0)])
    assert fit.k == pytest.approx(1.2) and fit.cv == 0.0 and fit.k_low is None
    c = fit.calibrate(2400.0)
    assert c.tokens_per_s_per_gpu == pytest.approx(2000.0) and c.low_tokens_per_s_per_gpu is None


def test_top_k_regret_counts_the_projected_top_k():
    runs = [MeasuredRun(tag=t, projected_tokens_per_s_per_gpu=p, measured_tokens_per_s_per_gpu=m)
            for t, p, m in (("a", 100, 80), ("b", 90, 100), ("c", 80, 70), ("d", 70, 60))]
    ra = rank_agreement(runs, top_k=2)
    assert ra.top1_regret == pytest.approx(0.2)   # picks a (80) instead of b (100)
    assert ra.topk_regret == 0.0                  # measuring a and b finds b
    assert [(f.a, f.b) for f in ra.discordant] == [("a", "b")]


def test_bad_input_names_the_value():
    with pytest.raises(InvalidConfigError, match="measured_tokens_per_s_per_gpu=0"):
        MeasuredRun(tag="x", projected_tokens_per_s_per_gpu=1.0, measured_tokens_per_s_per_gpu=0)
    with pytest.raises(InvalidConfigError, match="at least one"):
        fit_offset([])
    one = [MeasuredRun(tag="x", projected_tokens_per_s_per_gpu=1.0, measured_tokens_per_s_per_gpu=1.0)]
    with pytest.raises(InvalidConfigError, match="at least two"):
        rank_agreement(one)
    with pytest.raises(InvalidConfigError, match="repeated: x"):
        rank_agreement(one * 2)


pos = st.floats(min_value=100.0, max_value=1e5, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(pos, pos), min_size=3, max_size=12), st.floats(min_value=0.5, max_value=2.0))
def test_a_constant_offset_is_recovered_and_keeps_the_order(measured_and_noise, scale):
    """Projections that are the measurements times one constant: k = that constant, cv = 0, perfect ranks."""
    meas = sorted({round(m, 3) for m, _ in measured_and_noise})
    if len(meas) < 3:
        return
    runs = [MeasuredRun(tag=str(i), projected_tokens_per_s_per_gpu=m * scale, measured_tokens_per_s_per_gpu=m)
            for i, m in enumerate(meas)]
    fit = fit_offset(runs)
    assert fit.k == pytest.approx(scale) and fit.cv < 1e-9
    ra = rank_agreement(runs)
    assert ra.concordant == ra.pairs and not ra.discordant and ra.top1_regret == 0.0
    assert ra.spearman == pytest.approx(1.0) and ra.kendall == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(pos, pos), min_size=2, max_size=10))
def test_pair_counts_add_up_and_calibration_inverts_k(pairs):
    runs = [MeasuredRun(tag=str(i), projected_tokens_per_s_per_gpu=p, measured_tokens_per_s_per_gpu=m)
            for i, (p, m) in enumerate(pairs)]
    ra = rank_agreement(runs)
    assert ra.concordant + len(ra.discordant) + ra.ties == ra.pairs
    assert ra.concordant_above <= ra.pairs_above <= ra.pairs
    assert 0.0 <= ra.topk_regret <= ra.top1_regret < 1.0
    fit = fit_offset(runs)
    assert fit.k_min <= fit.k <= fit.k_max
    c = fit.calibrate(1000.0)
    assert math.isclose(c.tokens_per_s_per_gpu * fit.k, 1000.0)
    assert c.low_tokens_per_s_per_gpu <= c.tokens_per_s_per_gpu <= c.high_tokens_per_s_per_gpu
    assert measured_gap(pairs[0][1], pairs[-1][1]) >= 0.0


def test_rank_correlations_are_undefined_on_too_few_or_constant_inputs():
    from oracle.offset import rank_correlations
    assert rank_correlations([1.0, 2.0], [1.0, 2.0]) == (None, None)
    assert rank_correlations([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) == (None, None)
    rho, tau = rank_correlations([1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0])
    assert rho == pytest.approx(0.8) and tau == pytest.approx(2 / 3)
