"""Calibration against a user's own runs: the workload offset k and rank agreement (paper Sec. 4.8, App. E).

For each configuration of one workload (same model, cluster and sequence length, different
parallelism / recompute / batch knobs) the user measured tokens/s/GPU and the oracle projected it.
The paper's finding is that ``k = projected / measured`` is a workload-level factor that drifts only
mildly between configurations, so

* a calibrated projection is ``projected / k``, with an uncertainty band from the spread of k;
* what the search needs - the order of the candidates - survives the offset; rank agreement says how
  well: Spearman rho, Kendall tau, concordant/discordant pairs with the measured gap each spans,
  concordance of the pairs more than ``threshold`` apart, and top-1 / top-k regret (paper Table 21).

Nothing here projects: callers pass (projected, measured) pairs; the CLI (``calibrate-runs``) projects
configurations with the oracle when the user gives configs instead of projected numbers.
"""
from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from oracle.errors import InvalidConfigError

CONCORDANCE_THRESHOLD = 0.09
"""Measured gap above which a pair must be ordered correctly (paper Table 21: '> 9%'; the gap is
|a - b| / min(a, b), which reproduces the table's 10/10, 10/10 and 27/27 pair counts)."""
PREDICTION_LEVEL = 0.95
"""Coverage of the band of a calibrated projection (a Student-t prediction interval for the k of a new
configuration of the same workload)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRun:
    """One configuration the user ran: what the oracle projected and what the run measured."""

    tag: str
    """The user's name for the run (a CSV tag, a config file name)."""
    projected_tokens_per_s_per_gpu: float
    """The oracle's projection (uncalibrated)."""
    measured_tokens_per_s_per_gpu: float
    """Sustained throughput the run measured."""

    def __post_init__(self) -> None:
        for name in ("projected_tokens_per_s_per_gpu", "measured_tokens_per_s_per_gpu"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise InvalidConfigError(f"run {self.tag!r}: {name}={v!r} must be a positive number (tokens/s/GPU)")

    @property
    def k(self) -> float:
        """This run's offset: projected / measured (> 1 = the projection is optimistic)."""
        return self.projected_tokens_per_s_per_gpu / self.measured_tokens_per_s_per_gpu


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibrated:
    """A projection divided by the workload offset, with its band."""

    projected_tokens_per_s_per_gpu: float
    """The uncalibrated projection."""
    tokens_per_s_per_gpu: float
    """projected / k (k = the mean offset)."""
    low_tokens_per_s_per_gpu: float | None
    """projected / k_high (None with a single measured run: one run gives k but no spread)."""
    high_tokens_per_s_per_gpu: float | None
    """projected / k_low (None with a single measured run)."""

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFit:
    """The workload offset fitted to n measured runs (paper Sec. 4.8: k is the mean of the per-run
    ratios and cv their population standard deviation over the mean, e.g. Mixtral 1.128 (2.4%))."""

    n: int
    """Measured runs."""
    k: float
    """Mean of projected/measured over the runs (the paper's 'offset k')."""
    k_median: float
    """Median of the per-run offsets (paper Table 21's k~)."""
    k_std: float
    """Population standard deviation of the per-run offsets (0 for one run)."""
    cv: float
    """k_std / k (the paper's 'cv')."""
    k_min: float
    k_max: float
    k_low: float | None
    """Lower end of the prediction interval for the k of an unmeasured configuration
    (mean - t * s * sqrt(1 + 1/n), s the sample standard deviation; None for n = 1)."""
    k_high: float | None
    """Upper end of that interval (None for n = 1)."""
    level: float
    """Coverage of [k_low, k_high]."""

    def calibrate(self, projected_tokens_per_s_per_gpu: float) -> Calibrated:
        """``projected / k`` with the band ``[projected / k_high, projected / k_low]``."""
        p = float(projected_tokens_per_s_per_gpu)
        return Calibrated(projected_tokens_per_s_per_gpu=p, tokens_per_s_per_gpu=p / self.k,
                          low_tokens_per_s_per_gpu=None if self.k_high is None else p / self.k_high,
                          high_tokens_per_s_per_gpu=None if self.k_low is None else p / self.k_low)

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def fit_offset(runs: Sequence[MeasuredRun], *, level: float = PREDICTION_LEVEL) -> OffsetFit:
    """Fit the workload offset k to ``runs`` (one or more); see :class:`OffsetFit`."""
    if not runs:
        raise InvalidConfigError("calibration needs at least one measured run (got none)")
    if not 0.0 < level < 1.0:
        raise InvalidConfigError(f"level={level!r} must be in (0, 1), e.g. 0.95")
    ks = [r.k for r in runs]
    n = len(ks)
    mean = min(max(statistics.fmean(ks), min(ks)), max(ks))  # a mean of equal values can round 1 ulp past them
    pstd = statistics.pstdev(ks) if n > 1 else 0.0
    k_low = k_high = None
    if n > 1:
        from scipy.stats import t
        half = float(t.ppf(0.5 + level / 2, n - 1)) * statistics.stdev(ks) * math.sqrt(1.0 + 1.0 / n)
        k_low, k_high = max(mean - half, 1e-9), mean + half
    return OffsetFit(n=n, k=mean, k_median=statistics.median(ks), k_std=pstd, cv=pstd / mean,
                     k_min=min(ks), k_max=max(ks), k_low=k_low, k_high=k_high, level=level)


@dataclass(frozen=True, slots=True, kw_only=True)
class PairFlip:
    """Two runs the projection orders differently from the measurement."""

    a: str
    b: str
    measured_gap: float
    """|measured_a - measured_b| / min(measured_a, measured_b)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankAgreement:
    """How well the projected order of the runs matches the measured one (paper Table 21)."""

    n: int
    spearman: float | None
    """Spearman rho of projected vs measured (None for n < 3)."""
    kendall: float | None
    """Kendall tau-b (None for n < 3)."""
    pairs: int
    """n * (n - 1) / 2."""
    concordant: int
    """Pairs ordered the same way by the projection and the measurement."""
    discordant: tuple[PairFlip, ...]
    """Pairs ordered the other way, with the measured gap each spans (largest first)."""
    ties: int
    """Pairs tied in the projection or in the measurement (neither concordant nor discordant)."""
    threshold: float
    """The gap of the threshold-aware concordance."""
    pairs_above: int
    """Pairs whose measured gap exceeds ``threshold``."""
    concordant_above: int
    """Of those, the concordant ones."""
    top1_regret: float
    """1 - measured(projected best) / measured best: the cost of trusting the projection's pick."""
    top_k: int
    topk_regret: float
    """1 - best measured among the projected top-k / measured best: the cost when the user measures
    the projection's top k and keeps the best."""
    max_k_deviation: float
    """max |k_i - median k| (paper Table 21's |k - k~|)."""
    max_k_deviation_tag: str

    def to_dict(self) -> dict:
        d = asdict(self)
        d["discordant"] = [asdict(p) for p in self.discordant]
        return d


def measured_gap(a: float, b: float) -> float:
    """Relative gap of two throughputs, |a - b| / min(a, b) (paper Table 21)."""
    return abs(a - b) / min(a, b)


def rank_correlations(xs: Sequence[float], ys: Sequence[float]) -> tuple[float | None, float | None]:
    """Spearman rho and Kendall tau-b of two equal-length sequences; None where undefined (fewer than three
    points, or a constant input)."""
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None, None
    from scipy.stats import kendalltau, spearmanr
    rho, tau = float(spearmanr(xs, ys).statistic), float(kendalltau(xs, ys).statistic)
    return (None if math.isnan(rho) else rho), (None if math.isnan(tau) else tau)


def rank_agreement(runs: Sequence[MeasuredRun], *, threshold: float = CONCORDANCE_THRESHOLD,
                   top_k: int = 3) -> RankAgreement:
    """Rank agreement of ``runs`` (at least two; rho and tau need three)."""
    if len(runs) < 2:
        raise InvalidConfigError(f"rank agreement needs at least two measured runs (got {len(runs)})")
    if top_k < 1:
        raise InvalidConfigError(f"top_k={top_k} must be a positive integer")
    tags = [r.tag for r in runs]
    if len(set(tags)) != len(tags):
        dup = sorted({t for t in tags if tags.count(t) > 1})
        raise InvalidConfigError(f"run tags must be unique; repeated: {', '.join(dup)}")
    proj = [r.projected_tokens_per_s_per_gpu for r in runs]
    meas = [r.measured_tokens_per_s_per_gpu for r in runs]
    n = len(runs)
    rho, tau = rank_correlations(proj, meas)
    concordant = ties = above = conc_above = 0
    flips = []
    for i, j in itertools.combinations(range(n), 2):
        dp, dm = proj[i] - proj[j], meas[i] - meas[j]
        gap = measured_gap(meas[i], meas[j])
        if gap > threshold:
            above += 1
        if dp == 0 or dm == 0:
            ties += 1
            continue
        if (dp > 0) == (dm > 0):
            concordant += 1
            conc_above += gap > threshold
        else:
            flips.append(PairFlip(a=runs[i].tag, b=runs[j].tag, measured_gap=gap))
    best = max(meas)
    order = sorted(range(n), key=lambda i: -proj[i])
    k_med = statistics.median(r.k for r in runs)
    dev_i = max(range(n), key=lambda i: abs(runs[i].k - k_med))
    return RankAgreement(
        n=n, spearman=rho, kendall=tau, pairs=n * (n - 1) // 2, concordant=concordant,
        discordant=tuple(sorted(flips, key=lambda f: -f.measured_gap)), ties=ties, threshold=threshold,
        pairs_above=above, concordant_above=conc_above, top1_regret=1.0 - meas[order[0]] / best, top_k=top_k,
        topk_regret=1.0 - max(meas[i] for i in order[:top_k]) / best,
        max_k_deviation=abs(runs[dev_i].k - k_med), max_k_deviation_tag=runs[dev_i].tag)
