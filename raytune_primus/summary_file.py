"""Reading a results directory's ``summary.json`` (what ``tune`` and ``compare`` write; ``report``, ``export`` and
``calibrate-runs`` read it back): one reader, so a file that is not JSON, not an object, or whose keys have the wrong
types is one error naming the key, never a traceback in whichever reader meets it first."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oracle.errors import InvalidConfigError, clip

_OBJ, _LIST, _STR, _NUM = (dict,), (list,), (str,), (int, float)
SUMMARY_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "winner": (_OBJ, True), "optimum": (_OBJ, True), "experiment": (_STR, True), "experiment_file": (_STR, True),
    "ledger": (_STR, True), "numerics": (_OBJ, True), "oracle_mode": (_STR, True), "best_so_far": (_LIST, True),
    "curves": (_OBJ, True), "searchers": (_OBJ, True), "budget": (_NUM, True), "plots": (_LIST, True),
    "seeds": (_LIST, True),
}
"""The keys the readers use: their JSON types and whether null is allowed (a run with no winner writes null)."""
ENTRY_TYPES: dict[str, tuple[type, ...]] = {"config": _OBJ, "projection": _OBJ, "tokens_per_s_per_gpu": _NUM}
"""Keys of ``winner`` / ``optimum`` the readers use, and their types (each may be absent)."""
_NAMES = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}


def _kind(v: Any) -> str:
    return "null" if v is None else {bool: "true/false", dict: "an object", list: "a list", str: "a string"}.get(
        type(v), "a number" if isinstance(v, (int, float)) else type(v).__name__)


def summary_problems(summary: Any) -> list[str]:
    """One line per key of a parsed ``summary.json`` whose type its readers cannot use."""
    if not isinstance(summary, dict):
        return [f"must be a JSON object (what tune and compare write), got {_kind(summary)}"]
    out = []
    for key, (types, nullable) in SUMMARY_TYPES.items():
        v = summary.get(key)
        if (v is None and nullable) or (isinstance(v, types) and not isinstance(v, bool)):
            continue
        out.append(f"{key} must be {_NAMES[types[0]]}{' or null' if nullable else ''}, got {_kind(v)}: "
                   f"{clip(json.dumps(v, default=str), 60)}")
    for key in ("winner", "optimum"):
        entry = summary.get(key)
        if not isinstance(entry, dict):
            continue
        for sub, types in ENTRY_TYPES.items():
            v = entry.get(sub)
            if v is not None and not (isinstance(v, types) and not isinstance(v, bool)):
                out.append(f"{key}.{sub} must be {_NAMES[types[0]]}, got {_kind(v)}: "
                           f"{clip(json.dumps(v, default=str), 60)}")
    return out


def read_summary(path: Path) -> dict[str, Any]:
    """``path`` (a ``summary.json``) parsed and checked (:func:`summary_problems`); raises InvalidConfigError."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise InvalidConfigError(f"{str(path)!r} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise InvalidConfigError(f"{str(path)!r} is not valid JSON: {exc}") from None
    problems = summary_problems(summary)
    if problems:
        raise InvalidConfigError([f"{str(path)!r}: {p}" for p in problems]
                                 + ["it is not a summary.json as tune or compare write it: run the search again "
                                    "into that folder (--fresh) or give another results directory"])
    return summary
