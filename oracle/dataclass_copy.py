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

from dataclasses import MISSING, fields, replace
from typing import Any, TypeVar

T = TypeVar("T")

_FIELDS: dict[type, "_Spec | None"] = {}
_new = object.__new__
_set = object.__setattr__


def slot_setter(cls: type, name: str) -> Any:
    """The setter of field ``name``'s slot (its member descriptor's ``__set__``: quicker than
    ``object.__setattr__``, and past a frozen class's guard), or None where the class keeps it in a ``__dict__``."""
    d = cls.__dict__.get(name)
    return d.__set__ if type(d).__name__ == "member_descriptor" else None


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
            env[f"_s{i}"] = slot_setter(cls, f.name) or (lambda obj, v, _n=f.name: _set(obj, _n, v))
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


def fast_init(cls: type[T]) -> type[T]:
    """Class decorator (above ``@dataclass``): the ``__init__`` of a frozen slots dataclass that is built in bulk,
    generated with the same parameters and defaults but setting each slot through its member descriptor instead of
    ``object.__setattr__`` (an :class:`oracle.opgraph.Op`: 2.1 -> 1.2 us; a new layer shape builds ~40 of them).
    Only for a class whose ``__init__`` does nothing but assign its fields (all ``init`` fields, plain defaults, no
    ``__post_init__``, one ``kw_only`` setting); any other class is returned unchanged."""
    fs = fields(cls)  # type: ignore[arg-type]
    if (hasattr(cls, "__post_init__") or any(not f.init or f.default_factory is not MISSING for f in fs)
            or len({f.kw_only for f in fs}) > 1):
        return cls
    env: dict[str, Any] = {}
    params, body = [], []
    for i, f in enumerate(fs):
        env[f"_s{i}"] = slot_setter(cls, f.name)
        if env[f"_s{i}"] is None:
            return cls
        if f.default is MISSING:
            params.append(f.name)
        else:
            env[f"_d{i}"] = f.default
            params.append(f"{f.name}=_d{i}")
        body.append(f"    _s{i}(self, {f.name})")
    star = "*, " if fs and fs[0].kw_only else ""
    exec(f"def __init__(self, {star}{', '.join(params)}):\n" + "\n".join(body or ["    pass"]) + "\n", env)  # noqa: S102
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[misc]
    return cls
