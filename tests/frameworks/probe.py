"""Runs in a child process with ``.frameworks/`` on its path: reads the frameworks' own config classes.

``python tests/frameworks/probe.py COMMAND IN.json OUT.json`` (``tests/frameworks/frameworks.py`` calls
it; never imported by the test process, whose modules it would disturb). Commands:

* ``catalog``: every name the frameworks know: Megatron-LM's argparse flags (``megatron/training/
  arguments.py``), the fields of Megatron-Core's config dataclasses, of Megatron-Bridge's
  ``ConfigContainer`` and each of its sections, and of TorchTitan's ``Trainer.Config`` sections.
* ``megatron``: for each case (an argv), Megatron-LM's own parser, ``validate_args`` and the config
  objects Megatron-LM builds from the arguments (``core_transformer_config_from_args``,
  ``get_megatron_ddp_config``, ``get_megatron_optimizer_config``); the error of each (a name Megatron warns
  is deprecated counts as one), or None.
* ``torchtitan``: for each case (``--module M --config C`` and overrides), TorchTitan's own
  ``ConfigManager.parse_args``; the error, or None.

The frameworks declare Python >= 3.12 (Megatron) and pull in GPU-only stacks; to read their config
classes on this Python 3.11 CPU machine the child process (only it) adds: ``typing.override`` from
``typing_extensions`` (3.12 API); Megatron-Bridge package ``__init__`` files that only re-export
names are not executed, the names resolve on first use (they import every model bridge);
``megatron.energon`` (a multimodal data loader that ``megatron.bridge.training.config`` imports and
no config class uses) is a placeholder module; ``validate_args`` and the config classes are told the
case's GPU generation (compute capability) and that Transformer Engine is recent (every version check
passes), because no GPU and no TE exist here. Transformer Engine's kernels themselves stay absent:
a case turns off what needs them at config time (``--no-rope-fusion``).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.metadata
import io
import json
import os
import sys
import traceback
import typing
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: its raytune_primus
from raytune_primus.frameworks import setup  # noqa: E402 - the import view (module doc)

DISTRIBUTIONS = ("megatron-core", "megatron-bridge", "torchtitan")


# --------------------------------------------------------------------------------------------- catalog
def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _dataclass_members(tp: Any) -> list[type]:
    """The dataclasses a field annotation allows (X, X | None, Union[X, Y], ...)."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return [tp]
    return [c for arg in typing.get_args(tp) for c in _dataclass_members(arg)]


def _fields(cls: type) -> dict[str, str]:
    """Field name -> its annotation as text, for every init field of a dataclass."""
    return {f.name: f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}


def _megatron_parser() -> argparse.ArgumentParser:
    from megatron.training.arguments import add_megatron_arguments
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False, exit_on_error=False)
    return add_megatron_arguments(parser)


def catalog(_: Any) -> dict[str, Any]:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
    out: dict[str, Any] = {"versions": {d: importlib.metadata.version(d) for d in DISTRIBUTIONS},
                           "classes": {}, "sections": {}}
    flags: dict[str, dict[str, Any]] = {}
    for action in _megatron_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        entry = flags.setdefault(action.dest, {"flags": [], "choices": None, "takes_value": action.nargs != 0})
        entry["flags"] += [s for s in action.option_strings if s not in entry["flags"]]
        if action.choices is not None:
            entry["choices"] = sorted(map(str, action.choices))
    out["megatron_lm_args"] = flags
    core = [ModelParallelConfig, TransformerConfig, MLATransformerConfig, DistributedDataParallelConfig, OptimizerConfig]
    for cls in core:
        out["classes"][_qualname(cls)] = _fields(cls)

    from megatron.bridge.training.comm_overlap import CommOverlapConfig
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.mixed_precision import MixedPrecisionConfig
    hints = typing.get_type_hints(ConfigContainer)
    for f in dataclasses.fields(ConfigContainer):
        if f.name.startswith("_"):
            continue
        members = _dataclass_members(hints.get(f.name, f.type))
        out["sections"][f.name] = [_qualname(c) for c in members]
        for cls in members:
            out["classes"][_qualname(cls)] = _fields(cls)
    for cls in (CommOverlapConfig, MixedPrecisionConfig):
        out["classes"][_qualname(cls)] = _fields(cls)
    out["bridge_container"] = _qualname(ConfigContainer)

    from torchtitan.trainer import Trainer
    sections: dict[str, list[str]] = {}
    hints = typing.get_type_hints(Trainer.Config, include_extras=False)
    for f in dataclasses.fields(Trainer.Config):
        members = _dataclass_members(hints.get(f.name, f.type))
        sections[f.name] = [_qualname(c) for c in members]
        for cls in members:
            out["classes"][_qualname(cls)] = _fields(cls)
    out["torchtitan_sections"] = sections
    return out


# -------------------------------------------------------------------------------------------- megatron
@contextlib.contextmanager
def _gpu(capability: tuple[int, int], env: dict[str, str]):
    """What validate_args and the config classes ask the machine, answered for the case's GPU: its compute
    capability, a recent Transformer Engine (every ``is_te_min_version`` check passes) and the launch
    environment of the case."""
    import torch
    answers = {"get_device_arch_version": lambda: capability[0], "is_te_min_version": lambda *a, **k: True}
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, env))
        stack.enter_context(mock.patch.object(torch.cuda, "get_device_capability", lambda *a, **k: capability))
        for name, module in list(sys.modules.items()):
            if name.startswith("megatron.") and module is not None:
                for attr, value in answers.items():
                    if callable(getattr(module, attr, None)):
                        stack.enter_context(mock.patch.object(module, attr, value))
        yield


def _error(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text if str(exc) or not isinstance(exc, AssertionError) else \
        text + " at " + traceback.extract_tb(exc.__traceback__)[-1].line


def megatron(cases: list[dict[str, Any]]) -> list[str | None]:
    from megatron.training.arguments import validate_args
    from megatron.training.argument_utils import core_transformer_config_from_args
    from megatron.training.training import get_megatron_ddp_config, get_megatron_optimizer_config
    results: list[str | None] = []
    for case in cases:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args, unknown = _megatron_parser().parse_known_args(case["argv"])
        except (argparse.ArgumentError, SystemExit) as exc:  # a bad choice, type or missing value
            results.append(f"argparse: {' '.join(err.getvalue().split()) or exc}")
            continue
        if unknown:
            results.append(f"argparse: unrecognized arguments: {' '.join(unknown)}")
            continue
        args.world_size, args.rank = case["world_size"], 0
        try:
            with _gpu(tuple(case["capability"]), case.get("env", {})), contextlib.redirect_stdout(io.StringIO()), \
                    warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                validate_args(args)
                core_transformer_config_from_args(args)
                get_megatron_ddp_config(args)
                get_megatron_optimizer_config(args)
        except Exception as exc:  # noqa: BLE001 - the framework's own refusal is the result
            results.append(_error(exc))
            continue
        deprecated = sorted({" ".join(str(w.message).split()) for w in caught if "deprecat" in str(w.message).lower()})
        results.append(f"deprecated: {' | '.join(deprecated)}" if deprecated else None)
    return results


# ------------------------------------------------------------------------------------------ torchtitan
def torchtitan(cases: list[list[str]]) -> list[str | None]:
    from torchtitan.config import ConfigManager
    results: list[str | None] = []
    for argv in cases:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                ConfigManager().parse_args(argv)
        except SystemExit:  # tyro prints why (unknown name, bad value) and exits
            results.append(" ".join(err.getvalue().split()) or "tyro exited")
        except Exception as exc:  # noqa: BLE001
            results.append(_error(exc))
        else:
            results.append(None)
    return results


COMMANDS = {"catalog": catalog, "megatron": megatron, "torchtitan": torchtitan}

if __name__ == "__main__":
    command, src, dst = sys.argv[1:4]
    setup()
    payload = json.loads(Path(src).read_text())
    with contextlib.redirect_stdout(sys.stderr):  # the frameworks print; the answer goes to dst
        result = COMMANDS[command](payload)
    Path(dst).write_text(json.dumps(result))
