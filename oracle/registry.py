"""Named YAML components (model cards, hardware profiles): bundled by name, or a file by path.

A bare name that matches a bundled file wins over a same-named file in the working directory; a
value with a suffix or a slash is a path. A bare name that matches neither is looked up loosely: case
and punctuation aside (``Qwen3_30B_a3B`` is ``qwen3-30b-a3b``), and against the ``aliases`` a bundled
file lists (``H100-SXM-80GB`` is ``h100-sxm``), as published tables spell them. Parsed components are cached by key, and path loads by
(resolved path, mtime), so editing a file during a session is picked up; the cache keeps the
:data:`CACHE_ENTRIES` most recently used (a long session loading many files stays bounded).
"""
from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from oracle.errors import InvalidConfigError, UnknownComponentError

T = TypeVar("T")
SUFFIXES = (".yaml", ".yml", ".json")
MAX_NAME_CHARS = 255
"""Longest bundled name or file name (POSIX NAME_MAX); longer ones never reach the file system."""
MAX_PATH_CHARS = 4096
"""Longest path (Linux PATH_MAX)."""
CACHE_ENTRIES = 256
"""Parsed components a registry keeps (least recently used dropped first)."""


def loose_key(name: str) -> str:
    """``name`` without case and punctuation: the key of the loose lookup."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _aliases_in(path: Path) -> list[str]:
    """The ``aliases`` list of a bundled YAML file (read without validating the rest)."""
    import yaml
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return []
    raw = data.get("aliases") if isinstance(data, dict) else None
    return [a for a in raw if isinstance(a, str)] if isinstance(raw, list) else []


def check_name(kind: str, name_or_path: object) -> str:
    """``name_or_path`` if it can name a component; InvalidConfigError (one line, value cut short) otherwise.

    Checked before any file-system call, so a 5,000-character or NUL-bearing value is a clear error
    instead of ``OSError: File name too long``.
    """
    if not isinstance(name_or_path, str):
        raise InvalidConfigError(f"{kind} must be a name or a path to a YAML file, got a "
                                 f"{type(name_or_path).__name__} ({str(name_or_path)[:60]!r})")
    shown = repr(name_or_path[:60]) + (f"... ({len(name_or_path):,} characters)" if len(name_or_path) > 60 else "")
    if not name_or_path.strip():
        raise InvalidConfigError(f"{kind} name is empty; give a bundled name or a path to a YAML file")
    if any(ord(c) < 32 for c in name_or_path):
        raise InvalidConfigError(f"{kind} {shown} contains control characters; give a bundled name or a path")
    longest = max(len(part.encode("utf-8", "surrogatepass")) for part in name_or_path.split("/"))
    if longest > MAX_NAME_CHARS or len(name_or_path.encode("utf-8", "surrogatepass")) > MAX_PATH_CHARS:
        raise InvalidConfigError(f"{kind} {shown} is too long: a name or file name is at most {MAX_NAME_CHARS} "
                                 f"bytes and a path at most {MAX_PATH_CHARS}")
    return name_or_path


class YamlRegistry(Generic[T]):
    def __init__(self, kind: str, directory: Path, parse_bundled: Callable[[Path, str], T],
                 parse_path: Callable[[Path], T]) -> None:
        self.kind, self.directory = kind, directory
        self._dir = str(directory)
        self._parse_bundled, self._parse_path = parse_bundled, parse_path
        self._cache: OrderedDict[object, T] = OrderedDict()
        self._names: list[str] = []
        self._names_stamp: int | None = None
        self._loose: dict[str, set[str]] = {}
        self._loose_stamp: int | None = None

    def _cached(self, key: object, parse: Callable[[], T]) -> T:
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        value = self._cache[key] = parse()
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return value

    def names(self) -> list[str]:
        # listed once per change of the folder (its mtime moves when a file is added or removed): the
        # projector asks on every to_dict(), and a glob per call cost ~0.7 ms
        stamp = self.directory.stat().st_mtime_ns
        if self._names_stamp != stamp:
            self._names = sorted(p.stem for p in self.directory.glob("*.yaml"))
            self._names_stamp = stamp
        return list(self._names)

    def resolve(self, name: str) -> str | None:
        """The bundled name ``name`` means under the loose lookup (case, punctuation, aliases), or None.

        Ambiguous (two bundled files claim the same loose key): InvalidConfigError naming both."""
        stamp = self.directory.stat().st_mtime_ns
        if self._loose_stamp != stamp:
            loose: dict[str, set[str]] = {}
            for n in self.names():
                for key in [n, *_aliases_in(self.directory / f"{n}.yaml")]:
                    loose.setdefault(loose_key(key), set()).add(n)
            self._loose, self._loose_stamp = loose, stamp
        hits = sorted(self._loose.get(loose_key(name), ()))
        if len(hits) > 1:
            raise InvalidConfigError(f"{self.kind} {name!r} is ambiguous: it could be {' or '.join(hits)}; "
                                     f"give the exact name")
        return hits[0] if hits else None

    def bundled(self, name: str) -> T | None:
        """The parsed bundled component ``name`` if this process has loaded it (no file-system call), else None."""
        key = ("bundled", name)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
        return hit

    def load(self, name_or_path: str) -> T:
        # a bundled name loaded before: from the cache, without the stat below (validate loads a card and a profile
        # per row). Its file's existence was checked then; like the parse itself, the answer is kept for the process.
        if type(name_or_path) is str and (hit := self.bundled(name_or_path)) is not None:
            return hit
        name_or_path = check_name(self.kind, name_or_path)
        # string paths, not pathlib: validate loads a card and a profile per row (pathlib's parsing was ~half of it)
        is_path = "/" in name_or_path or os.path.splitext(name_or_path)[1].lower() in SUFFIXES
        if not is_path and _exists(bundled := os.path.join(self._dir, f"{name_or_path}.yaml")):
            return self._cached(("bundled", name_or_path), lambda: self._parse_bundled(Path(bundled), name_or_path))
        path = Path(name_or_path)
        if not is_path and not _exists(path):
            canonical = self.resolve(name_or_path)
            if canonical is not None:
                return self.load(canonical)
            raise UnknownComponentError(self.kind, name_or_path, self.names())
        try:
            key = ("path", str(path.resolve()), path.stat().st_mtime_ns)
        except (OSError, RuntimeError):  # missing or unreadable: the parser reports it with its own message
            return self._parse_path(path)
        return self._cached(key, lambda: self._parse_path(path))


def _exists(path: Path | str) -> bool:
    """``os.path.exists(path)``: False instead of raising (permissions, odd names)."""
    try:
        return os.path.exists(path)
    except (OSError, ValueError):
        return False
