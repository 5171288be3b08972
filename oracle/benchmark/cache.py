"""On-disk measurement cache: one JSON file per (device, software versions, layer signature, settings).

A search measures each distinct layer shape once per machine and reuses it; ``--no-cache`` bypasses it.
Default location: ``$RAYTUNE_PRIMUS_CACHE`` or ``~/.cache/raytune-primus/bench``.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from oracle.benchmark.measurement import Measurement


def default_cache_dir() -> Path:
    env = os.environ.get("RAYTUNE_PRIMUS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "raytune-primus" / "bench"


class MeasurementCache:
    """Measurements keyed by device name, software versions, layer signature (incl. dtype) and settings."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.dir = Path(directory) if directory is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(device: str, versions: dict[str, str], spec_key: str, settings: dict[str, Any]) -> str:
        blob = json.dumps({"device": device, "versions": versions, "spec": spec_key, "settings": settings},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def _path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def get(self, key: str) -> Measurement | None:
        p = self._path(key)
        try:
            data = json.loads(p.read_text())
            m = Measurement.from_dict(data["measurement"])
        except (OSError, ValueError, KeyError, TypeError):
            self.misses += 1
            return None
        self.hits += 1
        return m

    def put(self, key: str, m: Measurement, meta: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump({"meta": meta, "measurement": m.to_dict()}, fh, indent=1)
        os.replace(tmp, self._path(key))  # atomic: concurrent measurers never see half a file
