"""benchmarks/calibrate.py --joint: the per-generation fit with one host cost per vendor stack."""
import importlib.util
import math
from pathlib import Path

import numpy as np
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
    assert set(fits["ampere"]["names"]) <= set(cal.STACK_PARAMS) and "host_op_s" in fits["ampere"]["names"]
    stall = {g: f["x"][f["names"].index("moe_sync_stall_s")] for g, f in fits.items() if "moe_sync_stall_s" in f["names"]}
    assert len({round(float(stall[g]), 12) for g in nvidia if g in stall}) == 1  # the sync stall: one per stack too
    assert not any(cal.generation_of(r.part) == "ampere" for r in rows)


def test_the_fit_improves_its_rows_and_stays_in_bounds(cal, fitted):
    """A MAP fit with soft-L1 rows: the rows' robust loss can only fall from the priors (x = 0, where the
    prior term is zero)."""
    _, fits = fitted

    def loss(key: str) -> float:
        z = [float(x) / cal.ROW_SD for f in fits.values() for x in f[key]]
        return float(sum(v ** 2 for v in cal._robust(np.array(z))))
    assert loss("after") <= loss("before")
    for gen, f in fits.items():
        assert all(cal.log_bounds(n)[0] <= v <= cal.log_bounds(n)[1] for n, v in zip(f["names"], f["x"])), gen
        assert all(math.exp(abs(a)) - 1 < 1.0 for a in f["after"]), gen  # no fitted row left 100% off


@pytest.mark.parametrize("marker", ["RECOMPUTE_GUESS", "TOKEN_DROP_GUESS"])
def test_rows_with_a_guessed_setting_are_not_fitted_on(cal, fitted, marker):
    """validate projects a row that does not fit without recompute with the fastest recompute that fits,
    and a token-drop row with a capacity factor nobody published; the fit learns only from rows whose
    settings are published or defaults that fit. The NVIDIA rows publish their recipes, so their recipe cell is
    emptied here to show the guess and the exclusion."""
    import oracle.validate as v
    rows, _ = fitted
    ids = {r.id for r in rows}
    stripped = [dict(r, recipe="") for r in v.read_rows(CSVS[1])]
    guessed = [r for r in stripped if any(getattr(v, marker) in a for a in v.row_to_run(r)[1])]
    assert guessed
    assert all(cal._fit_run(r, quiet=True) is None for r in guessed[:4])
    as_published = [r["id"] for r in v.read_rows(CSVS[0]) + v.read_rows(CSVS[1])
                    if any(getattr(v, marker) in a for a in v.row_to_run(r)[1])]
    assert not ids & set(as_published)


def test_rows_whose_recipe_is_not_what_ran_are_not_fitted_on(cal, fitted):
    """recipes.md: a low-confidence recipe was read from code that does not reproduce the printed layout."""
    import oracle.validate as v
    rows, _ = fitted
    low = {r["id"] for r in v.read_rows(CSVS[1]) if "confidence=low" in r["recipe_source"]}
    assert low and not {r.id for r in rows} & low


def test_an_outlier_row_pulls_linearly_not_quadratically(cal):
    """Soft-L1: a row within one ROW_SD weighs as in least squares; a row 6 spreads off (a software
    release the model has no term for) weighs about 6x, not 36x, one row at one spread."""
    import numpy as np
    r = cal._robust(np.array([0.1, 1.0, 6.0, -6.0]))
    assert r[0] ** 2 == pytest.approx(0.01, rel=0.01)
    assert r[2] ** 2 == pytest.approx(2 * (math.sqrt(37) - 1), rel=1e-12) and r[3] == -r[2]
    assert r[2] ** 2 < 12 and r[1] ** 2 == pytest.approx(2 * (math.sqrt(2) - 1))
