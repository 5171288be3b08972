"""Loading YAML/JSON files with one-line errors instead of parser tracebacks."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from oracle.errors import InvalidConfigError


MAX_FILE_BYTES = 16 * 2**20
"""Largest YAML/JSON file read (configs, cards, profiles, specs, HF configs are a few KiB)."""


def load_mapping(path: str | Path, what: str = "file") -> dict[str, Any]:
    """Read a YAML or JSON file whose top level must be a mapping.

    YAML is read with PyYAML's safe loader only: a tag that would build a Python object
    (``!!python/object``, ``!!python/name``, ...) is refused with a one-line error, never executed.
    """
    p = Path(path)
    try:
        if not p.exists():
            raise InvalidConfigError(f"{what} {_shown(p)} does not exist")
        if p.is_dir():
            raise InvalidConfigError(f"{what} {_shown(p)} is a directory, expected a YAML or JSON file")
        size_bytes = p.stat().st_size
        if size_bytes > MAX_FILE_BYTES:
            raise InvalidConfigError(f"{what} {_shown(p)} is {size_bytes:,} bytes; at most {MAX_FILE_BYTES:,} "
                                     f"are read (is it the right file?)")
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InvalidConfigError(f"{what} {_shown(p)} cannot be read: {exc.strerror or type(exc).__name__}") from None
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        tag = str(exc.problem or "").split("tag ")[-1].strip(" '").replace("tag:yaml.org,2002:", "!!")
        raise InvalidConfigError(f"{what} {_shown(p)} uses the YAML tag {tag!r}{where}, which is refused: files are "
                                 f"read with a safe loader (plain mappings, lists, strings and numbers only)"
                                 ) from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        if isinstance(exc, json.JSONDecodeError):
            where = f" at line {exc.lineno}, column {exc.colno}"
        if isinstance(exc, RecursionError):
            reason = "nested too deeply"
        elif type(exc) is ValueError:  # e.g. an integer of more than 4,300 digits
            reason = str(exc).splitlines()[0].split(";")[0][:200]
        else:
            reason = getattr(exc, "problem", None) or getattr(exc, "msg", None) or str(exc).splitlines()[0]
        raise InvalidConfigError(f"{what} {_shown(p)} is not valid YAML/JSON{where}: {reason}") from None
    if data is None:
        raise InvalidConfigError(f"{what} {_shown(p)} is empty")
    if not isinstance(data, dict):
        raise InvalidConfigError(
            f"{what} {_shown(p)} must hold a mapping at the top level, got a {type(data).__name__}")
    return data


def _shown(p: Path) -> str:
    """The path for a message: quoted, and cut short when absurdly long."""
    text = str(p)
    return repr(text) if len(text) <= 200 else f"{text[:120]!r}... ({len(text):,} characters)"
