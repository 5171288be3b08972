"""Megatron-Core / Megatron-Bridge / TorchTitan read from ``.frameworks/`` (``scripts/install-frameworks.sh``) in a
process of their own, on a CPU machine without Transformer Engine: the import view both the framework tests
(``tests/frameworks/probe.py``) and the Megatron-Bridge recipe reader (:mod:`raytune_primus.bridge_recipes`) use.

The frameworks declare Python >= 3.12 and pull in GPU-only stacks; :func:`setup` (called in the child process only,
never in a process whose modules it would disturb) adds ``typing.override`` from ``typing_extensions`` (3.12 API),
creates Megatron-Bridge package ``__init__`` files that only re-export names without running them (a name resolves
on first use: they would import every model bridge, PEFT and Transformer Engine), and makes ``megatron.energon``
(a multimodal data loader that ``megatron.bridge.training.config`` imports and no config class uses) a placeholder.
"""
from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import typing
import warnings
from pathlib import Path
from typing import Any

FRAMEWORKS = Path(os.environ.get("RAYTUNE_PRIMUS_FRAMEWORKS", Path(__file__).resolve().parents[1] / ".frameworks"))
"""Where ``scripts/install-frameworks.sh`` installs the frameworks (``RAYTUNE_PRIMUS_FRAMEWORKS`` overrides it)."""
INSTALL_HINT = "run `bash scripts/install-frameworks.sh`"
PINS = Path(__file__).resolve().parents[1] / "scripts" / "frameworks.txt"
"""What scripts/install-frameworks.sh installs (exact versions); its copy in FRAMEWORKS marks the install."""


def unavailable() -> str | None:
    """Why the frameworks cannot be read here (not installed, or other versions than the pins), or None."""
    stamp = FRAMEWORKS / PINS.name
    if not stamp.is_file() or not PINS.is_file():
        return f"the frameworks are not installed in {FRAMEWORKS} ({INSTALL_HINT})"
    if stamp.read_text() != PINS.read_text():
        return f"{FRAMEWORKS} holds other versions than {PINS.name} pins ({INSTALL_HINT})"
    return None


class _ReexportOnlyInit(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Packages under ``prefix`` whose ``__init__`` only re-exports names: created without running it;
    a re-exported name imports its module on first use. Any other ``__init__`` runs as usual."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.exports: dict[str, dict[str, tuple[str, str]]] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != self.prefix and not name.startswith(self.prefix + "."):
            return None
        pkg = FRAMEWORKS.joinpath(*name.split("."))
        init = pkg / "__init__.py"
        if not init.is_file():
            return None
        exports: dict[str, tuple[str, str]] = {}
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.ImportFrom):
                module = importlib.util.resolve_name("." * node.level + (node.module or ""), name) \
                    if node.level else node.module
                exports.update({a.asname or a.name: (module, a.name) for a in node.names})
            elif isinstance(node, (ast.Import, ast.Assign)) or (
                    isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
                continue  # registration side effects, __all__, deprecated aliases, the docstring
            else:
                return None
        self.exports[name] = exports
        spec = importlib.machinery.ModuleSpec(name, self, origin=str(init), is_package=True)
        spec.submodule_search_locations = [str(pkg)]
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        exports = self.exports[module.__name__]

        def __getattr__(attr: str) -> Any:
            if attr not in exports:
                raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}")
            source, real = exports[attr]
            try:
                value = getattr(importlib.import_module(source), real)
            except AttributeError:
                value = importlib.import_module(f"{source}.{real}")
            setattr(module, attr, value)
            return value

        module.__getattr__ = __getattr__  # type: ignore[method-assign]


class _Placeholder(types.ModuleType):
    """A runtime-only dependency no config class uses: every attribute is an empty class."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = type(attr, (), {})
        setattr(self, attr, value)
        return value


def setup() -> None:
    """The child process's view of the frameworks (see the module doc)."""
    import typing_extensions
    warnings.simplefilter("ignore")
    typing.override = getattr(typing, "override", typing_extensions.override)  # type: ignore[attr-defined]
    sys.path.insert(0, str(FRAMEWORKS))
    sys.modules["megatron.energon"] = _Placeholder("megatron.energon")
    sys.meta_path.insert(0, _ReexportOnlyInit("megatron.bridge"))
