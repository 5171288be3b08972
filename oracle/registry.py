"""Named YAML components (model cards, hardware profiles): bundled by name, or a file by path.

A bare name that matches a bundled file wins over a same-named file in the working directory; a
value with a suffix or a slash is a path. Parsed components are cached by key, and path loads by
(resolved path, mtime), so editing a file during a session is picked up.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from oracle.errors import UnknownComponentError

T = TypeVar("T")
SUFFIXES = (".yaml", ".yml", ".json")


class YamlRegistry(Generic[T]):
    def __init__(self, kind: str, directory: Path, parse_bundled: Callable[[Path, str], T],
                 parse_path: Callable[[Path], T]) -> None:
        self.kind, self.directory = kind, directory
        self._parse_bundled, self._parse_path = parse_bundled, parse_path
        self._cache: dict[object, T] = {}

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.directory.glob("*.yaml"))

    def load(self, name_or_path: str) -> T:
        bundled = self.directory / f"{name_or_path}.yaml"
        is_path = "/" in name_or_path or Path(name_or_path).suffix.lower() in SUFFIXES
        if not is_path and bundled.exists():
            key: object = ("bundled", name_or_path)
            if key not in self._cache:
                self._cache[key] = self._parse_bundled(bundled, name_or_path)
            return self._cache[key]
        path = Path(name_or_path)
        if not is_path and not path.exists():
            raise UnknownComponentError(self.kind, name_or_path, self.names())
        try:
            key = ("path", str(path.resolve()), path.stat().st_mtime_ns)
        except OSError:  # missing file: let the parser report it with its own message
            return self._parse_path(path)
        if key not in self._cache:
            self._cache[key] = self._parse_path(path)
        return self._cache[key]
