"""``dataclasses.replace`` without its per-call overhead, for the op-graph and memory-block builders (issue 27).

Building the op graph and memory blocks of a new shape copies thousands of frozen dataclasses with one or two
fields changed; ``dataclasses.replace`` re-walks the field list and calls ``__init__`` with every field as a
keyword (~8 us for an :class:`oracle.opgraph.Op`). :func:`replace_fast` copies the field values straight into a
new instance (~4 us): the same object as ``replace`` would build, for dataclasses whose fields are all
``__init__`` fields and that have no ``__post_init__`` (nothing in ``__init__`` but assignments); any other
class, or an unknown field name, goes through ``dataclasses.replace`` itself (and its error).
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, TypeVar

T = TypeVar("T")

_FIELDS: dict[type, tuple[tuple[str, ...], frozenset[str]] | None] = {}
_new = object.__new__
_set = object.__setattr__


def _plain_fields(cls: type) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """(field names, the same as a set) of a dataclass whose ``__init__`` only assigns its fields; else None."""
    if cls in _FIELDS:
        return _FIELDS[cls]
    fs = fields(cls)
    plain = all(f.init for f in fs) and not hasattr(cls, "__post_init__") and "__init__" in cls.__dict__
    names = tuple(f.name for f in fs)
    out = (names, frozenset(names)) if plain else None
    _FIELDS[cls] = out
    return out


def replace_fast(obj: T, **changes: Any) -> T:
    """``dataclasses.replace(obj, **changes)``, faster for plain dataclasses (see the module docstring)."""
    cls = type(obj)
    spec = _plain_fields(cls)
    if spec is None or not spec[1].issuperset(changes):
        return replace(obj, **changes)
    new = _new(cls)
    for name in spec[0]:
        _set(new, name, changes[name] if name in changes else getattr(obj, name))
    return new
