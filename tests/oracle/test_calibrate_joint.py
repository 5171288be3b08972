"""benchmarks/calibrate.py --joint: the per-generation fit with one host cost per vendor stack."""
import importlib.util
import math
from pathlib import Path

import pytest

from tests.conftest import SHARED

ROOT = Path(__file__).resolve().parents[2]
CSVS = [SHARED / "validation" / "calibration.csv", SHARED / "validation" / "published-nvidia.csv"]
pytestmark = pytest.mark.skipif(not all(p.exists() for p in CSVS), reason="shared/validation CSVs not present")


@pytest.fixture(scope="module")
def cal():
    spec = importlib.util.spec_from_file_location("calibrate_joint_for_test", ROOT / "benchmarks" / "calibrate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fitted(cal):
    rows = cal.joint_rows([str(p) for p in CSVS], {"A", "B"}, quiet=True)
    return rows, cal.fit_all(rows)


def test_the_host_cost_is_one_multiplier_per_vendor_stack(cal, fitted):
    """The host issue cost is the host CPU's and the framework's, not the GPU's: every NVIDIA generation
    gets the same fitted multiplier, and a generation without rows (Ampere) gets it alone."""
    rows, fits = fitted
    host = {g: f["x"][f["names"].index("host_op_s")] for g, f in fits.items() if "host_op_s" in f["names"]}
    nvidia = [g for g in cal.HOST_GROUPS["nvidia"] if g in host]
    assert {"hopper", "blackwell", "blackwell-ultra", "ampere"} <= set(nvidia)
    assert len({round(float(host[g]), 12) for g in nvidia}) == 1
    assert fits["ampere"]["names"] == ["host_op_s"]
    assert not any(cal.generation_of(r.part) == "ampere" for r in rows)


def test_the_fit_improves_its_rows_and_stays_in_bounds(fitted):
    """A MAP fit: the rows' sum of squared log errors can only fall from the priors (x = 0)."""
    _, fits = fitted
    before = sum(float(x) ** 2 for f in fits.values() for x in f["before"])
    after = sum(float(x) ** 2 for f in fits.values() for x in f["after"])
    assert after <= before
    for gen, f in fits.items():
        assert all(-3.0 <= v <= 3.0 for v in f["x"]), gen
        assert all(math.exp(abs(a)) - 1 < 1.0 for a in f["after"]), gen  # no fitted row left 100% off


def test_rows_with_a_guessed_recompute_are_not_fitted_on(cal, fitted):
    """validate projects a row that does not fit without recompute with the fastest recompute that fits;
    the fit learns only from rows whose settings are published or defaults that fit."""
    from oracle.validate import RECOMPUTE_GUESS, read_rows, row_to_run
    rows, _ = fitted
    ids = {r.id for r in rows}
    guessed = [r["id"] for r in read_rows(CSVS[1]) if any(RECOMPUTE_GUESS in a for a in row_to_run(r)[1])]
    assert guessed and not ids & set(guessed)
