"""Megatron-Bridge's performance recipes read from the installed package: the runs NVIDIA's tables measure.

NVIDIA's published throughput tables (``../shared/validation/published-nvidia.csv`` holds some of them) measure the
performance recipes of Megatron-Bridge (``megatron/bridge/perf_recipes/<family>/<gpu>/*.py``, megatron-bridge 0.6.2 in
``.frameworks/``: ``scripts/install-frameworks.sh``). :func:`read_recipes` reads them mechanically and
:func:`recipe_config` turns one into a project config (model card, cluster, the recipe's settings under ``recipe:``):
``raytune-primus project --bridge-recipe NAME`` projects what a published run ran; ``benchmarks/bridge_recipes.py``
projects all of them.

How a recipe is read. A child process imports the recipe modules with the frameworks' import view
(:mod:`raytune_primus.frameworks`), with stand-ins: ``AutoBridge`` (which would download the Hugging Face config and
needs Transformer Engine) returns a recorder that keeps what the recipe sets on the model; Megatron-Bridge's PEFT and
conversion modules (Transformer Engine at import) are empty; ``apply_flex_dispatcher_backend`` answers for the
recipe's GPU instead of ``torch.cuda`` (DeepEP on H100, B200, B300; the alltoall fallback on GB200, GB300; HybridEP
and NCCL EP everywhere). Each ``*_config()`` function is called and its ConfigContainer read: every setting the
recipe put on the model, the train batch sizes, and the ``ddp``, ``comm_overlap``, ``mixed_precision`` and
``optimizer`` fields and ``env_vars`` that oracle.recipe has a name for. The model's architecture comes from the
bundled card the recipe's Hugging Face id names, not from the recorder: settings the Hugging Face config would carry
(MTP depth, rotary) are the card's. Supervised fine-tuning and LoRA recipes, vision-language recipes and DeepSeek-V4
do not run under these stand-ins (they read the real provider or import Transformer Engine) and come back with the
error that stopped them.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from oracle.errors import PrimusError
from raytune_primus.frameworks import FRAMEWORKS, INSTALL_HINT, unavailable

ROOT = Path(__file__).resolve().parents[1]
PERF_RECIPES = FRAMEWORKS / "megatron" / "bridge" / "perf_recipes"

HARDWARE = {"h100": "h100-sxm", "b200": "b200", "b300": "b300", "gb200": "gb200-nvl72", "gb300": "gb300-nvl72"}
"""perf_recipes/<family>/<gpu>/ -> bundled hardware profile (vr200 and r100 have none)."""

CARDS = {
    "openai/gpt-oss-120b": "gpt-oss-120b", "openai/gpt-oss-20b": "gpt-oss-20b",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3", "moonshotai/Kimi-K2-Instruct": "kimi-k2",
    "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b", "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b",
    "Qwen/Qwen3-Next-80B-A3B-Instruct": "qwen3-next-80b-a3b",
    "meta-llama/Meta-Llama-3-8B": "llama3-8b", "meta-llama/Meta-Llama-3-70B": "llama3-70b",
    "meta-llama/Meta-Llama-3.1-405B": "llama3.1-405b",
}
"""The Hugging Face id a recipe builds its model from -> the bundled card of that model."""

HYBRID_CARDS = (("nemotronh_56b", "nemotronh-56b"), ("nemotron_3_nano", "nemotron3-nano-30b-a3b"))
"""Recipes whose model is a Megatron-Bridge HybridModelProvider (no Hugging Face id): function-name prefix -> card."""

PROVIDER_DERIVED = ("gradient_accumulation_fusion",)
"""Fields of a provider dataclass that are not read from the dataclass: their defaults are computed at import from
whether Transformer Engine or Apex is present (``megatron.bridge.utils.fusions``), which it is not in the child
process; the projection's own default (the fused path every recipe runs) stands instead. The mixed-precision fields
of a provider are not read either: Megatron-Bridge's finalize writes the ``mixed_precision`` section's over them."""

DEEPEP_GPUS = ("h100", "b200", "b300")
"""The perf_recipes GPU folders Megatron-Bridge's apply_flex_dispatcher_backend lets DeepEP run on (compute capability
8 or 9, or a device named B200 / B300); elsewhere (GB200, GB300) it falls back to the alltoall dispatcher."""

SECTIONS = ("ddp", "comm_overlap", "mixed_precision", "optimizer")
"""ConfigContainer sections whose fields are read (those oracle.recipe has a name for; the rest are defaults of
checkpointing, logging and data loading)."""


class BridgeRecipeError(PrimusError):
    """A Megatron-Bridge performance recipe that cannot be read or has no card / profile here."""


# ---------------------------------------------------------------------------------------------- the child
def _child(out_path: str, only: str | None = None) -> int:  # pragma: no cover - runs under .frameworks, a subprocess
    import dataclasses
    import enum
    import importlib
    import importlib.abc
    import importlib.machinery
    import inspect
    import types

    from raytune_primus.frameworks import setup
    setup()

    class _Empty(types.ModuleType):
        __path__: list[str] = []

        def __getattr__(self, attr: str) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            value = type(attr, (), {"__init__": lambda self, *a, **k: None})
            setattr(self, attr, value)
            return value

    class _EmptyModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        PREFIXES = ("megatron.bridge.peft", "megatron.bridge.models.conversion")

        def find_spec(self, name, path, target=None):
            if any(name == p or name.startswith(p + ".") for p in self.PREFIXES):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            return _Empty(spec.name)

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, _EmptyModules())
    import megatron.bridge

    class Recorder:
        """What a recipe sets on the model provider; an unset field reads as None."""

        def __init__(self, hf_id: str) -> None:
            object.__setattr__(self, "hf_id", hf_id)
            object.__setattr__(self, "fields", {})

        def __getattr__(self, k: str) -> Any:
            if k.startswith("__"):
                raise AttributeError(k)
            return self.fields.get(k)

        def __setattr__(self, k: str, v: Any) -> None:
            self.fields[k] = v

    class AutoBridge:
        def __init__(self, hf_id: str) -> None:
            self.hf_id = hf_id

        @classmethod
        def from_hf_pretrained(cls, hf_id: str, **_: Any) -> "AutoBridge":
            return cls(hf_id)

        def to_megatron_provider(self, **_: Any) -> Recorder:
            return Recorder(self.hf_id)

    megatron.bridge.AutoBridge = AutoBridge

    # Megatron-Bridge's apply_flex_dispatcher_backend decides from the GPU it runs on (torch.cuda) whether the flex
    # dispatcher backend a recipe asks for applies or falls back to alltoall; here it answers for the recipe's GPU
    from megatron.bridge.training import flex_dispatcher_backend as fdb
    target = {"gpu": ""}

    def apply_flex_dispatcher_backend(model_config: Any, moe_flex_dispatcher_backend: str | None = None) -> None:
        backend, gpu = moe_flex_dispatcher_backend, target["gpu"]
        if backend not in ("deepep", "hybridep", "ncclep"):
            return  # "Not a valid flex dispatcher backend ... Skipping"
        if backend == "deepep" and gpu not in DEEPEP_GPUS:  # DeepEP: Ampere, Hopper, B200 and B300 only
            model_config.moe_token_dispatcher_type = "alltoall"
            model_config.moe_flex_dispatcher_backend = None
            return
        model_config.moe_token_dispatcher_type = "flex"  # HybridEP and NCCL EP: every Hopper / Blackwell part
        model_config.moe_flex_dispatcher_backend = backend
        model_config.moe_shared_expert_overlap = False

    fdb.apply_flex_dispatcher_backend = apply_flex_dispatcher_backend

    def plain(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, enum.Enum):
            return v.name
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        return repr(v)

    def fields(obj: Any) -> dict[str, Any]:
        if isinstance(obj, Recorder):  # private attributes (a recipe's layout builder callable) are not settings
            return {k: plain(v) for k, v in obj.fields.items() if not k.startswith("_")}
        if dataclasses.is_dataclass(obj):
            return {f.name: plain(getattr(obj, f.name, None)) for f in dataclasses.fields(obj)}
        return {}

    out: list[dict[str, Any]] = []
    for path in sorted(PERF_RECIPES.glob("*/*/*.py")):
        if path.name == "__init__.py" or (only and f"def {only}(" not in path.read_text()):
            continue
        module = "megatron.bridge.perf_recipes." + ".".join(path.relative_to(PERF_RECIPES).with_suffix("").parts)
        family, gpu = path.relative_to(PERF_RECIPES).parts[:2]
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - reported per module
            out.append({"module": module, "family": family, "gpu": gpu, "function": None,
                        "error": f"{type(exc).__name__}: {exc}"})
            continue
        for name, fn in list(vars(mod).items()):
            if name.startswith("_") or not name.endswith("_config") or not inspect.isfunction(fn) \
                    or fn.__module__ != module or (only and name != only):
                continue
            rec: dict[str, Any] = {"module": module, "family": family, "gpu": gpu, "function": name}
            target["gpu"] = gpu
            try:
                cfg = fn()
            except Exception as exc:  # noqa: BLE001 - reported per recipe
                out.append({**rec, "error": f"{type(exc).__name__}: {exc}"})
                continue
            rec.update(
                hf_id=getattr(cfg.model, "hf_id", None) if isinstance(cfg.model, Recorder) else None,
                provider=type(cfg.model).__name__, model=fields(cfg.model),
                recorded=isinstance(cfg.model, Recorder),
                train={k: getattr(cfg.train, k, None) for k in ("global_batch_size", "micro_batch_size")},
                dataset_seq_length=getattr(cfg.dataset, "seq_length", None),
                env=plain(dict(getattr(cfg, "env_vars", None) or {})),
                **{s: fields(getattr(cfg, s, None)) for s in SECTIONS})
            out.append(rec)
    Path(out_path).write_text(json.dumps(out, indent=1))
    return 0


def read_recipes(only: str | None = None) -> list[dict[str, Any]]:
    """Every performance recipe's settings (see the module doc), or only the function ``only``'s, read in a child
    process; a BridgeRecipeError saying what to do where the frameworks are not installed or do not import."""
    reason = unavailable() or (None if PERF_RECIPES.is_dir() else f"{PERF_RECIPES} is missing ({INSTALL_HINT})")
    if reason:
        raise BridgeRecipeError(f"Megatron-Bridge's performance recipes cannot be read: {reason}")
    with tempfile.TemporaryDirectory(prefix="bridge-recipes-") as tmp:
        dst = Path(tmp) / "recipes.json"
        env = {**os.environ, "RAYTUNE_PRIMUS_FRAMEWORKS": str(FRAMEWORKS), "PYTHONWARNINGS": "ignore"}
        cmd = [sys.executable, "-m", "raytune_primus.bridge_recipes", str(dst)] + ([only] if only else [])
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0 or not dst.exists():
            tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-3:] or ["no output"]
            raise BridgeRecipeError("reading the recipes failed: " + " | ".join(tail))
        return json.loads(dst.read_text())


def recipe_config(rec: dict[str, Any]) -> dict[str, Any]:
    """The project config of one read recipe (model card, cluster, its settings under ``recipe:``); a
    BridgeRecipeError naming what is missing where the recipe did not run or has no card or profile."""
    name = rec.get("function") or rec.get("module")
    if rec.get("error"):
        raise BridgeRecipeError(f"{name} did not run under the stand-ins: {rec['error']}")
    card, hw = card_of(rec), HARDWARE.get(rec["gpu"])
    if card is None:
        raise BridgeRecipeError(f"{name}: no bundled card for {rec.get('hf_id') or rec['provider']} (bundled: "
                                f"{', '.join(sorted(set(CARDS.values()) | {c for _, c in HYBRID_CARDS}))})")
    if hw is None:
        raise BridgeRecipeError(f"{name}: no hardware profile for its GPU folder {rec['gpu']!r} (profiles for: "
                                f"{', '.join(HARDWARE)})")
    return {"model": card, "cluster": {"hardware": hw, "num_gpus": num_gpus_of(rec)}, "training": {},
            "recipe": recipe_mapping(rec)}


def load_recipe_config(name: str) -> dict[str, Any]:
    """:func:`recipe_config` of the performance recipe function ``name`` (e.g.
    ``deepseek_v3_pretrain_256gpu_gb300_fp8mx_config``); a BridgeRecipeError listing close names if none is."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name or ""):
        raise BridgeRecipeError(f"--bridge-recipe {name!r} is not a function name (e.g. "
                                f"deepseek_v3_pretrain_256gpu_gb300_fp8mx_config)")
    found = read_recipes(only=name)
    if not found:
        names = sorted(n for p in PERF_RECIPES.glob("*/*/*.py") for n in re.findall(r"^def ([a-z0-9_]+_config)\(",
                                                                                      p.read_text(), re.M))
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
        raise BridgeRecipeError(f"no Megatron-Bridge performance recipe {name!r} in {PERF_RECIPES}"
                                + (f"; close: {', '.join(close)}" if close else f" ({len(names)} recipes there)"))
    return recipe_config(found[0])


# ------------------------------------------------------------------------------------------- the parent
def card_of(rec: dict[str, Any]) -> str | None:
    if rec.get("hf_id"):
        return CARDS.get(rec["hf_id"])
    return next((card for prefix, card in HYBRID_CARDS if rec["function"].startswith(prefix)), None)


def num_gpus_of(rec: dict[str, Any]) -> int:
    m = re.search(r"_(\d+)gpu_", rec["function"])
    if not m:  # every 0.6 recipe names its GPU count; a later one might not
        raise BridgeRecipeError(f"{rec['function']}: no '<N>gpu' in the recipe's name to size the cluster by")
    return int(m.group(1))


def recipe_mapping(rec: dict[str, Any]) -> dict[str, Any]:
    """The recipe as oracle.recipe names it: every field the recipe set on a recorded model (a known name or not:
    the unknown ones come back as ignored), the known fields of a provider dataclass and of the sections, the
    batch sizes and the environment."""
    from oracle.recipe import SETTINGS, canonical

    def known(key: str) -> bool:
        c = canonical(key)
        return c in SETTINGS or (c.startswith("no_") and c[3:] in SETTINGS)

    mp = rec["mixed_precision"]
    out: dict[str, Any] = {}
    for k, v in rec["model"].items():
        if v is None or not (rec["recorded"] or known(k)):
            continue
        if not rec["recorded"] and (k in mp or k in PROVIDER_DERIVED):
            continue  # a dataclass default that Megatron-Bridge's finalize overwrites (see PROVIDER_DERIVED)
        out[k] = v
    for section in SECTIONS:
        for k, v in rec[section].items():
            if v is None or not known(k):
                continue
            if section == "optimizer" and k != "optimizer" and not k.startswith("muon_"):
                continue  # Megatron-Bridge copies the DDP overlap and sharding settings onto these at finalize
            if section == "mixed_precision" and ((k == "fp8_recipe" and not mp.get("fp8"))
                                                 or (k == "fp4_recipe" and not mp.get("fp4"))):
                continue  # the dataclass default of an unused format
            # mixed-precision fields are bare (they outrank the ddp.* copy, as Megatron-Bridge's finalize does)
            key = k if section == "mixed_precision" else f"{section}.{k}"
            if section == "optimizer" and k == "optimizer":
                key = "optimizer"
            out.setdefault(key, v)
    for k, v in rec["train"].items():
        if v is not None:
            out[k] = v
    if "seq_length" not in out and rec.get("dataset_seq_length"):
        out["seq_length"] = rec["dataset_seq_length"]
    for k, v in rec["env"].items():
        out[f"env.{k}"] = v
    return out


if __name__ == "__main__":  # the child process of read_recipes: OUT.json [FUNCTION]
    raise SystemExit(_child(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
