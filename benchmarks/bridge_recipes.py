"""Every Megatron-Bridge performance recipe, read from the package and projected: the runs NVIDIA's tables measure.

    .venv/bin/python benchmarks/bridge_recipes.py [--family gpt_oss] [--format table|json] [--out FILE.json]

NVIDIA's published throughput tables (``../shared/validation/published-nvidia.csv`` holds some of them) measure the
performance recipes of Megatron-Bridge (``megatron/bridge/perf_recipes/<family>/<gpu>/*.py``). The ``recipe`` column
of that file was read from the same functions by hand. This script reads all of them the same way, mechanically,
including the families no row of any file here measures (GPT-OSS, Kimi-K2, Qwen3-235B, Qwen3-Next, Nemotron-H), and
projects each one whose model has a bundled card and whose GPU has a hardware profile. It checks the product where a
new user would meet it first: a published recipe must be read whole (``ignored:`` lists every Megatron setting it
carries that the projection does not price), must not be refused, and should fit in the memory it ran in. No
published number is read and nothing is compared: this finds refusals, memory verdicts and unread settings.

How a recipe is read. A child process (``.frameworks/``: ``scripts/install-frameworks.sh``) imports the recipe
modules with the loader tests/frameworks/probe.py uses, with two stand-ins: ``AutoBridge`` (which would download the
Hugging Face config and needs Transformer Engine) returns a recorder that keeps what the recipe sets on the model, and
Megatron-Bridge's PEFT and conversion modules (Transformer Engine at import) are empty. Each ``*_config()`` function
is called and its ConfigContainer read: every setting the recipe put on the model, the train batch sizes, and the
``ddp``, ``comm_overlap``, ``mixed_precision`` and ``optimizer`` fields and ``env_vars`` that oracle.recipe has a
name for. The model's architecture comes from the bundled card (the recipe's Hugging Face id names it), not from
the recorder: settings the Hugging Face config would carry (MTP depth, rotary) are the card's. Supervised
fine-tuning and LoRA recipes, vision-language recipes and DeepSeek-V4 do not run under these stand-ins (they read
the real provider or import Transformer Engine) and are listed as such.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FRAMEWORKS = Path(os.environ.get("RAYTUNE_PRIMUS_FRAMEWORKS", ROOT / ".frameworks"))
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


# ---------------------------------------------------------------------------------------------- the child
def _child(out_path: str) -> int:  # pragma: no cover - runs under .frameworks in a subprocess
    import dataclasses
    import enum
    import importlib
    import importlib.abc
    import importlib.machinery
    import inspect
    import types

    sys.path.insert(0, str(ROOT / "tests" / "frameworks"))
    import probe  # the loader the framework tests use (re-export-only __init__ files, energon placeholder)
    probe.setup()

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
        if path.name == "__init__.py":
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
                    or fn.__module__ != module:
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


def read_recipes() -> list[dict[str, Any]]:
    """Every performance recipe's settings (see the module doc), read in a child process."""
    if not PERF_RECIPES.is_dir():
        raise SystemExit(f"{PERF_RECIPES} is not here: run `bash scripts/install-frameworks.sh` first")
    with tempfile.TemporaryDirectory(prefix="bridge-recipes-") as tmp:
        dst = Path(tmp) / "recipes.json"
        env = {**os.environ, "RAYTUNE_PRIMUS_FRAMEWORKS": str(FRAMEWORKS), "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run([sys.executable, __file__, "--child", str(dst)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0 or not dst.exists():
            tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-3:] or ["no output"]
            raise SystemExit("reading the recipes failed:\n  " + "\n  ".join(tail))
        return json.loads(dst.read_text())


# ------------------------------------------------------------------------------------------- the parent
def card_of(rec: dict[str, Any]) -> str | None:
    if rec.get("hf_id"):
        return CARDS.get(rec["hf_id"])
    return next((card for prefix, card in HYBRID_CARDS if rec["function"].startswith(prefix)), None)


def num_gpus_of(rec: dict[str, Any]) -> int:
    m = re.search(r"_(\d+)gpu_", rec["function"])
    if not m:
        raise ValueError(f"{rec['function']}: no '<N>gpu' in the recipe's name")
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


def project_recipe(rec: dict[str, Any]) -> dict[str, Any]:
    """One recipe: what it is, and its projection or why there is none."""
    from oracle.config import RunConfig
    from oracle.errors import PrimusError
    from oracle.projector import project

    row: dict[str, Any] = {"recipe": rec["function"], "family": rec["family"], "gpu": rec["gpu"]}
    if rec.get("error"):
        return {**row, "status": "not read", "why": rec["error"]}
    card, hw = card_of(rec), HARDWARE.get(rec["gpu"])
    row.update(model=card, hardware=hw, num_gpus=num_gpus_of(rec))
    if card is None:
        return {**row, "status": "no card", "why": f"no bundled card for {rec.get('hf_id') or rec['provider']}"}
    if hw is None:
        return {**row, "status": "no profile", "why": f"no hardware profile for {rec['gpu']}"}
    mapping = recipe_mapping(rec)
    data = {"model": card, "cluster": {"hardware": hw, "num_gpus": row["num_gpus"]}, "training": {},
            "recipe": mapping}
    try:
        run = RunConfig.from_dict(data, where=rec["function"])
        p = project(run, memory_tree=False)
    except PrimusError as exc:
        return {**row, "status": "refused", "why": str(exc).replace("\n", " ")}
    t = run.training
    unknown = sorted(e.key for e in run.recipe if e.status == "ignored" and e.why == "not a setting this projection knows")
    ignored = sorted(e.describe() for e in run.recipe if e.status == "ignored"
                     and e.why != "not a setting this projection knows" and not e.key.startswith("env."))
    return {**row, "status": "projected",
            "layout": f"tp{t.tp} pp{t.pp} vpp{t.vpp} cp{t.cp} ep{t.ep} etp{t.etp} mbs{t.mbs} gbs{t.gbs} s{t.seq_len}",
            "precision": t.precision + (f"/{t.fp8_recipe}" if t.precision == "fp8" else ""),
            "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu, "tflops_per_gpu": p.tflops_per_gpu, "mfu": p.mfu,
            "peak_gib": p.memory.peak_bytes / 2**30, "cap_gib": p.memory.cap_bytes / 2**30,
            "fits": p.memory.fits, "unknown_settings": unknown, "ignored": ignored}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", metavar="OUT.json", help=argparse.SUPPRESS)
    ap.add_argument("--family", action="append", help="only these perf_recipes/<family> folders (repeatable)")
    ap.add_argument("--format", choices=("table", "json"), default="table")
    ap.add_argument("--out", help="also write every row as JSON here")
    args = ap.parse_args(argv)
    if args.child:
        return _child(args.child)
    recs = [r for r in read_recipes() if not args.family or r["family"] in args.family]
    rows = [project_recipe(r) for r in recs]
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    if args.format == "json":
        print(json.dumps(rows, indent=1))
        return 0
    done = [r for r in rows if r["status"] == "projected"]
    print(f"{'recipe':58s} {'layout':48s} {'prec':12s} {'tok/s/GPU':>9s} {'MFU':>6s} {'GiB':>6s} {'cap':>6s} fits")
    for r in done:
        print(f"{r['recipe'][:58]:58s} {r['layout'][:48]:48s} {r['precision']:12s} {r['tokens_per_s_per_gpu']:9,.0f} "
              f"{r['mfu']:6.1%} {r['peak_gib']:6.1f} {r['cap_gib']:6.1f} {'yes' if r['fits'] else 'NO'}")
    others = [r for r in rows if r["status"] != "projected"]
    if others:
        print("\nnot projected:")
        for r in others:
            print(f"  {r['recipe'] or r['family'] + '/' + r['gpu']}: {r['status']}: {r['why'][:300]}")
    unknown = Counter(k for r in done for k in r["unknown_settings"])
    if unknown:
        print("\nsettings the recipes carry that no projection setting knows (recipes carrying each):")
        for k, n in unknown.most_common():
            print(f"  {k}: {n}")
    print(f"\n{len(rows)} recipes: {len(done)} projected, "
          f"{sum(not r['fits'] for r in done)} of them over their memory cap; "
          + ", ".join(f"{n} {s}" for s, n in Counter(r['status'] for r in others).most_common()))
    if done:
        print(f"median MFU {statistics.median(r['mfu'] for r in done):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
