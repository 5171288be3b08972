"""Strict dict -> frozen dataclass conversion shared by every config type.

Unknown keys are the commonest user error, so they are rejected by name with a close match;
types are checked against the field annotations (int, float, bool, str, Literal[...], X | None, and
``Annotated[str, OneOf(...)]`` for a choice read from a registry when checked).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

from oracle.errors import InvalidConfigError, clip

T = TypeVar("T")


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_key_problems(data: dict[str, Any], valid: list[str], where: str) -> list[str]:
    """One line per key of ``data`` not in ``valid``."""
    return [f"{where}: unknown key {k!r}{_suggest(str(k), valid)}; valid keys: {', '.join(valid)}"
            for k in data if k not in valid]


@dataclass(frozen=True, slots=True)
class OneOf:
    """``Annotated[str, OneOf(choices)]``: the value must be one of ``choices()``, read at check time
    (a registry that grows by adding a module, e.g. the pipeline schedules)."""

    choices: Callable[[], Iterable[str]]


def coerce(value: Any, annotation: Any, name: str) -> Any:
    """Check/coerce ``value`` against ``annotation``; raise ValueError with a readable reason."""
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *meta = get_args(annotation)
        out = coerce(value, base, name)
        for m in meta:
            if isinstance(m, OneOf):
                choices = tuple(m.choices())
                if out not in choices and isinstance(out, str) and out.lower() in choices:
                    out = out.lower()
                if out not in choices:
                    raise ValueError(f"{name}={value!r} is not one of {' | '.join(choices)}")
        return out
    if origin in (typing.Union, types.UnionType):
        args = get_args(annotation)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, name)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(errors[0] if len(errors) == 1 else f"{name}={value!r} is not valid")
    if origin is Literal:
        choices = get_args(annotation)
        if value in choices:
            return value
        if isinstance(value, str) and value.lower() in choices:
            return value.lower()
        raise ValueError(f"{name}={value!r} is not one of {' | '.join(map(str, choices))}")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
        raise ValueError(f"{name}={value!r} must be true or false")
    if annotation is int:
        if isinstance(value, bool):
            raise ValueError(f"{name}={value!r} must be an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ValueError(f"{name}={value!r} must be an integer")
    if annotation is float:
        if isinstance(value, bool):
            raise ValueError(f"{name}={value!r} must be a number")
        try:
            if isinstance(value, (int, float)):
                return float(value)
            if isinstance(value, str):
                return float(value.strip())
        except ValueError:
            pass
        except OverflowError:  # an integer past float's range (~1.8e308)
            raise ValueError(f"{name}={clip(repr(value), 60)} is too large: a number must be below about "
                             f"1.8e308") from None
        raise ValueError(f"{name}={value!r} must be a number")
    if annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ValueError(f"{name}={value!r} must be a string")
    if origin is tuple or annotation is tuple:
        if isinstance(value, (list, tuple)):
            args = get_args(annotation)
            inner = args[0] if args else Any
            return tuple(value if inner is Any else coerce(v, inner, f"{name}[{i}]")
                         for i, v in enumerate(value))
        raise ValueError(f"{name}={value!r} must be a list")
    if origin is dict or annotation is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ValueError(f"{name}={value!r} must be a mapping")
    return value


@functools.lru_cache(maxsize=None)
def _schema(cls: type) -> tuple[dict[str, Any], list[dataclasses.Field], list[str], frozenset[str]]:
    """(type hints, init fields, their names, the names whose coercion depends on the value alone) of dataclass
    ``cls``: resolved once per class (``get_type_hints`` evaluates every string annotation, most of a
    ``from_dict``'s time when done per call)."""
    fields = [f for f in dataclasses.fields(cls) if f.init]
    hints = typing.get_type_hints(cls, include_extras=True)
    return hints, fields, [f.name for f in fields], frozenset(f.name for f in fields if _static(hints[f.name]))


def _static(annotation: Any) -> bool:
    """Whether :func:`coerce` of a value against ``annotation`` depends on the value alone: not where a
    :class:`OneOf` reads a registry (a schedule can be registered and unregistered)."""
    if any(isinstance(m, OneOf) for m in getattr(annotation, "__metadata__", ())):
        return False
    return all(_static(a) for a in get_args(annotation) if not isinstance(a, (str, int, float, bool)))


_COERCED: dict[tuple, Any] = {}
"""(class, field, value's type, value) -> what :func:`coerce` made of it: only successes, only values of
:data:`_SCALARS`, only fields whose coercion depends on the value alone (``_schema``); a refused value is checked
again, so its message names its own place."""
_MISSING = object()
_SCALARS = frozenset({str, int, bool, type(None)})
"""Value types whose equal values are interchangeable (a float is not: -0.0 == 0.0)."""


def from_dict(cls: type[T], data: Any, where: str, *, extra_problems: list[str] | None = None) -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys, missing keys and bad types.

    All problems are collected and raised together as one InvalidConfigError.
    """
    if not isinstance(data, dict):
        raise InvalidConfigError(f"{where} must be a mapping of keys to values, got a "
                                 f"{type(data).__name__}: {data!r}")
    hints, fields, names, static = _schema(cls)
    problems = list(extra_problems or [])
    problems += unknown_key_problems(data, names, where)
    kwargs: dict[str, Any] = {}
    for f in fields:
        name = f.name
        if name in data:
            value = data[name]
            key, out = None, _MISSING
            if name in static and value.__class__ in _SCALARS:
                # a value this field coerced before (a bulk reader meets the same values again and again)
                key = (cls, name, value.__class__, value)
                out = _COERCED.get(key, _MISSING)
            if out is _MISSING:
                try:
                    out = coerce(value, hints[name], f"{where}.{name}")
                except ValueError as exc:
                    problems.append(clip(str(exc)))
                    continue
                if key is not None:
                    if len(_COERCED) > 65536:
                        _COERCED.clear()
                    _COERCED[key] = out
            kwargs[name] = out
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            problems.append(f"{where}: missing required key {name!r}")
    if problems:
        raise InvalidConfigError(problems)
    return cls(**kwargs)


def to_dict(obj: Any) -> dict[str, Any]:
    """Plain-dict view of a (nested) dataclass, tuples as lists."""
    out = {}
    for name in _field_names(type(obj)):
        v = getattr(obj, name)
        if hasattr(v, "__dataclass_fields__") and not isinstance(v, type):  # dataclasses.is_dataclass, inlined
            v = to_dict(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[name] = v
    return out


@functools.lru_cache(maxsize=None)
def _field_names(cls: type) -> tuple[str, ...]:
    """The field names of dataclass ``cls`` (``dataclasses.fields``), once per class."""
    return tuple(f.name for f in dataclasses.fields(cls))
