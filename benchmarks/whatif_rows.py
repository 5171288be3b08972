"""The rows the what-if scripts (whatif_a2a_overlap.py, whatif_cuda_graphs.py) project two ways: the
newest-release MoE rows with EP > 1 of a published CSV, with their validate results as published."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oracle.validate import RowResult, read_rows, validate_rows  # noqa: E402

DEFAULT_CSV = Path(__file__).resolve().parents[2] / "shared" / "validation" / "published-nvidia.csv"


def newest_moe_rows(description: str) -> tuple[Path, list[dict[str, str]], dict[str, RowResult], list[dict[str, str]]]:
    """Parse the command line (one optional CSV path); return (path, every row, validate results by id, the
    newest-release projected MoE rows with EP > 1)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("csv", nargs="?", default=str(DEFAULT_CSV))
    path = Path(ap.parse_args().csv)
    rows = read_rows(path)
    published = {r.id: r for r in validate_rows(rows, base_dir=path.parent)}
    moe = [r for r in rows if published[r["id"]].error is not None and published[r["id"]].newest
           and (r.get("ep") or "1").strip() not in ("", "1")]
    return path, rows, published, moe
