"""``dataclasses.replace`` without its per-call overhead, for the op-graph and memory-block builders (issue 27).

Building the op graph and memory blocks of a new shape copies thousands of frozen dataclasses with one or two
fields changed; ``dataclasses.replace`` re-walks the field list and calls ``__init__`` with every field as a
keyword (~8 us for an :class:`oracle.opgraph.Op`). :func:`replace_fast` copies the field values straight into a
new instance with straight-line code generated per class (~1.4 us; a loop over the fields with
``object.__setattr__`` took ~2.5 us): the same object as ``replace`` would build, for dataclasses whose fields are all
``__init__`` fields and that have no ``__post_init__`` (nothing in ``__init__`` but assignments); any other
class, or an unknown field name, goes through ``dataclasses.replace`` itself (and its error).
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, TypeVar

T = TypeVar("T")

_FIELDS: dict[type, "_Spec | None"] = {}
_new = object.__new__
_set = object.__setattr__


class _Spec:
    """A plain dataclass's field names (a set), and its copy function: straight-line code generated per class (as
    ``dataclasses`` generates ``__init__``) that sets each field through its slot's member descriptor where the
    class has slots (faster than ``object.__setattr__``)."""

    __slots__ = ("name_set", "replace")

    def __init__(self, cls: type) -> None:
        fs = fields(cls)
        self.name_set = frozenset(f.name for f in fs)
        env: dict[str, Any] = {"_new": _new, "_cls": cls}
        rep = []
        for i, f in enumerate(fs):
            d = cls.__dict__.get(f.name)
            env[f"_s{i}"] = d.__set__ if type(d).__name__ == "member_descriptor" else (
                lambda obj, v, _n=f.name: _set(obj, _n, v))
            rep.append(f"    _s{i}(new, g({f.name!r}, obj.{f.name}))")
        src = ("def replace(obj, changes):\n    new = _new(_cls)\n    g = changes.get\n" + "\n".join(rep)
               + "\n    return new\n")
        exec(src, env)  # noqa: S102 (field names are identifiers: the class's own)
        self.replace = env["replace"]


def _plain_fields(cls: type) -> _Spec | None:
    """The :class:`_Spec` of a dataclass whose ``__init__`` only assigns its fields; else None."""
    if cls in _FIELDS:
        return _FIELDS[cls]
    fs = fields(cls)
    plain = all(f.init for f in fs) and not hasattr(cls, "__post_init__") and "__init__" in cls.__dict__
    out = _Spec(cls) if plain else None
    _FIELDS[cls] = out
    return out


def replace_fast(obj: T, **changes: Any) -> T:
    """``dataclasses.replace(obj, **changes)``, faster for plain dataclasses (see the module docstring)."""
    spec = _plain_fields(type(obj))
    if spec is None or not spec.name_set.issuperset(changes):
        return replace(obj, **changes)
    return spec.replace(obj, changes)


class HashedOnce:
    """Mixin for a frozen slots dataclass used as a cache key and built rarely (interned): the fields' hash is
    computed once, in ``__post_init__``, into the non-compared field ``_hash`` the class declares
    (``_hash: int = field(init=False, repr=False, compare=False)``), and never pickled (string hashes differ
    between processes: a copy hashes itself again). ``@dataclass`` writes its own ``__hash__``, ``__getstate__``
    and ``__setstate__`` unless the class body names them, so the class body sets them to these
    (``__hash__ = HashedOnce.__hash__``, ...). ``replace_fast`` sees the ``__post_init__`` and goes through
    ``dataclasses.replace``, which calls it."""

    __slots__ = ()

    def __post_init__(self) -> None:
        _set(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare)))  # type: ignore[arg-type]

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __getstate__(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self) if f.name != "_hash"]  # type: ignore[arg-type]

    def __setstate__(self, state: list[Any]) -> None:
        for f, v in zip([f for f in fields(self) if f.name != "_hash"], state):  # type: ignore[arg-type]
            _set(self, f.name, v)
        self.__post_init__()
