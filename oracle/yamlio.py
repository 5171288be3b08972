"""Loading YAML/JSON files with one-line errors instead of parser tracebacks."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from oracle.errors import InvalidConfigError


def load_mapping(path: str | Path, what: str = "file") -> dict[str, Any]:
    """Read a YAML or JSON file whose top level must be a mapping."""
    p = Path(path)
    if not p.exists():
        raise InvalidConfigError(f"{what} {str(p)!r} does not exist")
    if p.is_dir():
        raise InvalidConfigError(f"{what} {str(p)!r} is a directory, expected a YAML or JSON file")
    text = p.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        if isinstance(exc, json.JSONDecodeError):
            where = f" at line {exc.lineno}, column {exc.colno}"
        reason = getattr(exc, "problem", None) or getattr(exc, "msg", None) or str(exc).splitlines()[0]
        raise InvalidConfigError(f"{what} {str(p)!r} is not valid YAML/JSON{where}: {reason}") from None
    if data is None:
        raise InvalidConfigError(f"{what} {str(p)!r} is empty")
    if not isinstance(data, dict):
        raise InvalidConfigError(
            f"{what} {str(p)!r} must hold a mapping at the top level, got a {type(data).__name__}")
    return data
