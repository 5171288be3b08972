"""One error tree for the whole product (see STYLE.md "Errors").

Every message repeats the offending value and says what would be valid; the CLI prints
``str(err)`` (one line per problem) and exits 2, never a traceback.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class PrimusError(Exception):
    """Base of every error the product raises on purpose."""


def clip(text: str, limit: int = 400) -> str:
    """``text`` with its middle elided when longer than ``limit``: a 5,000-character value echoed in a
    message keeps the start (where, which key) and the end (what would be valid) on one short line."""
    if len(text) <= limit:
        return text
    head, tail = limit * 5 // 9, limit * 4 // 9
    return f"{text[:head]} ...[{len(text) - head - tail:,} characters]... {text[-tail:]}"


class InvalidConfigError(PrimusError, ValueError):
    """A configuration, model card, CSV row or experiment spec is not acceptable.

    ``problems`` holds one human-readable line per problem found, so a user fixes them all
    in one go instead of one per run.
    """

    def __init__(self, problems: str | Iterable[str]):
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class HardwareProfileError(PrimusError, ValueError):
    """A hardware profile YAML is malformed or incomplete."""


class UnknownComponentError(PrimusError, KeyError):
    """A name (model card, hardware profile, schedule, searcher) is not registered."""

    def __init__(self, kind: str, name: str, valid: Iterable[str]):
        self.kind, self.name, self.valid = kind, name, sorted(valid)
        close = difflib.get_close_matches(str(name).lower(), self.valid, n=2, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        super().__init__(f"unknown {kind} {name!r}; valid: {', '.join(self.valid)}{hint}")

    def __str__(self) -> str:  # KeyError would quote the whole message otherwise
        return self.args[0]


class BenchmarkError(PrimusError):
    """Benchmark mode cannot run (no torch, no device, a layer failed to time)."""
