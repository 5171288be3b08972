"""``validate``: project every row of a published-measurement CSV and score the projection.

Columns (as ../shared/validation/calibration.csv): id, group, model, hardware, num_gpus, the training
keys of the config file, measured_tokens_per_s_per_gpu, measured_tflops_per_gpu, measured_peak_mem_gib
(+ optional source, quality, notes). An empty training cell takes the config default and is listed
in the row's ``assumed``; a row that cannot be expressed is kept with its ``skipped`` reason.
"""
from __future__ import annotations

import csv
import os
import dataclasses
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.collector import bulk_pass
from oracle.config import FRAMEWORK_DEFAULTS, RunConfig, TrainingConfig
from oracle.errors import InvalidConfigError, PrimusError, clip
from oracle.units import GIB

REQUIRED_COLUMNS = ("id", "model", "hardware", "num_gpus")
MEASURED_COLUMNS = ("measured_tokens_per_s_per_gpu", "measured_tflops_per_gpu", "measured_peak_mem_gib")
INFO_COLUMNS = ("group", "source", "quality", "notes")
RECIPE_COLUMNS = ("recipe", "recipe_source")
"""What a row's run set beyond its layout (oracle.recipe), and where that was read from."""
TRAINING_KEYS = tuple(f.name for f in dataclasses.fields(TrainingConfig))
LIST_KEYS = ("recompute_modules", "cuda_graph_scope")
RECOMPUTE_GUESS = "the fastest memory setting that fits"
"""Marks the ``assumed`` note of a row whose unpublished memory setting validate chose (see
_assume_least_recompute); benchmarks/calibrate.py does not fit on such rows."""
TOKEN_DROP_GUESS = "Megatron-Core's drop-and-pad at 1.0 assumed"
"""Marks the ``assumed`` note of a token-drop row whose unpublished capacity factor validate chose
(_published_token_drop)."""
GUESSES = (RECOMPUTE_GUESS, TOKEN_DROP_GUESS)
"""Markers of settings validate chose for a row that ran with settings nobody published: calibrate.py
fits on none of them (the fit learns only from what ran)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RowResult:
    """One published row against its projection."""

    id: str
    """Row id in the CSV."""
    group: str
    """Source table (and, for NVIDIA, the NeMo container release)."""
    quality: str
    """How directly the row states its configuration (the CSV's quality column)."""
    quantity: str | None
    """'tokens_per_s_per_gpu' or 'tflops_per_gpu': what the row measured (None: neither)."""
    measured: float | None
    """Published value of ``quantity``."""
    projected: float | None = None
    """Projected value of ``quantity`` (None when skipped)."""
    error: float | None = None
    """projected / measured - 1."""
    skipped: str | None = None
    """Why the row was not projected (None when it was)."""
    fits: bool | None = None
    """The projection's memory verdict."""
    projected_peak_gib: float | None = None
    """Projected peak memory per GPU."""
    measured_peak_mem_gib: float | None = None
    """Published peak memory, when the row states one."""
    assumed: tuple[str, ...] = ()
    """Training keys the row does not publish, filled with documented defaults."""
    projection: Any = None
    """The full Projection (not serialised)."""
    release: str | None = None
    """Software release the row was measured on (NVIDIA tables: the NeMo container in ``group``)."""
    newest: bool = True
    """False when the same configuration was also published for a newer release (history, not target)."""
    model: str = ""
    """The row's model cell (per-model figures)."""
    recipe_priced: tuple[str, ...] = ()
    """The row's recipe settings that set what was projected (``key=value (what it set)``)."""
    recipe_ignored: tuple[str, ...] = ()
    """The row's recipe settings that price nothing, each with why (``key=value (why)``)."""

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("id", "group", "quality", "quantity", "measured", "projected",
                                             "error", "skipped", "fits", "projected_peak_gib",
                                             "measured_peak_mem_gib", "assumed", "release", "newest", "model")}
        out["assumed"] = list(self.assumed)
        out["recipe_priced"] = list(self.recipe_priced)
        out["recipe_ignored"] = list(self.recipe_ignored)
        return out


_RELEASE = re.compile(r"^\s*(\d+(?:\.\d+)+)\b")
_RECIPE = re.compile(r"fp8_recipe=([a-z0-9_]+)")
# the columns that are not part of what ran (identity of a configuration = every other column + FP8 recipe); the
# recipe column differs between releases by construction (each release's own settings): a configuration is its
# layout, so the newest release of a layout is the target whatever its software settings
_NOT_CONFIG = {"id", "source", "group", "quality", "notes", *MEASURED_COLUMNS, *RECIPE_COLUMNS}


def release_of(row: dict[str, str]) -> str | None:
    """The release a row's table belongs to (``26.04.01 NeMo Container ...`` -> ``26.04.01``), else None."""
    m = _RELEASE.match(row.get("group") or "")
    return m.group(1) if m else None


def config_identity(row: dict[str, str]) -> tuple:
    """What ran: every configuration column plus the FP8 recipe the notes state (one configuration
    published in several releases has one identity; current-scaling vs MXFP8 are two)."""
    recipe = _RECIPE.search(row.get("notes") or "")
    cells = tuple(sorted((k, _norm_cell(k, v)) for k, v in row.items() if k is not None and k not in _NOT_CONFIG))
    return cells + (("fp8_recipe", recipe.group(1) if recipe else ""),)


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainingConfig) if f.default is not dataclasses.MISSING}


def _norm_cell(key: str, value: str | None) -> str:
    """A cell as what it means: an empty cell is the config default; booleans and numbers in one spelling."""
    v = (value or "").strip().lower()
    if v == "" and key in _DEFAULTS:
        v = str(_DEFAULTS[key]).lower()
    if isinstance(_DEFAULTS.get(key), bool) and v in ("0", "1", "false", "true", "no", "yes"):
        v = "true" if v in ("1", "true", "yes") else "false"
    try:
        v = repr(float(v)) if v not in ("", "nan", "inf", "-inf") else v
    except ValueError:
        pass
    return v


def newest_flags(rows: list[dict[str, str]]) -> list[bool]:
    """Per row: is it the newest release of its configuration? Rows without a release are always newest."""
    def ver(r: str) -> tuple[int, ...]:
        return tuple(int(x) for x in r.split("."))
    best: dict[tuple, tuple[int, ...]] = {}
    for row in rows:
        rel = release_of(row)
        if rel is not None:
            key = config_identity(row)
            best[key] = max(best.get(key, ()), ver(rel))
    return [release_of(r) is None or best[config_identity(r)] == ver(release_of(r)) for r in rows]


def _num(v: str) -> float | None:
    v = (v or "").strip()
    if not v:
        return None
    return float(v)


def read_rows(path: str | Path) -> list[dict[str, str]]:
    p = Path(path)
    if not p.exists():
        raise InvalidConfigError(f"CSV {str(p)!r} does not exist")
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            rows = list(reader)
    except (csv.Error, UnicodeDecodeError) as exc:
        raise InvalidConfigError(f"CSV {str(p)!r} is malformed: {exc}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise InvalidConfigError(f"CSV {str(p)!r} lacks required column(s) {', '.join(missing)}; "
                                 f"header is: {', '.join(header) or '(empty)'}")
    if not any(c in header for c in MEASURED_COLUMNS[:2]):
        raise InvalidConfigError(f"CSV {str(p)!r} needs measured_tokens_per_s_per_gpu or measured_tflops_per_gpu")
    for i, r in enumerate(rows):
        if None in r:  # more cells than header columns
            raise InvalidConfigError(f"CSV {str(p)!r} row {i + 2} has {len(header) + len(r[None])} cells "
                                     f"but the header has {len(header)}")
    return rows


def _resolve(value: str, base_dir: Path | None) -> str:
    """A relative ``.yaml``/``.yml`` path (a custom model card or hardware profile) or a Hugging Face
    ``config.json`` path is read relative to the CSV's folder, so a CSV and its cards travel together;
    bundled names pass through."""
    if base_dir is None or not value.endswith((".yaml", ".yml", ".json")) or Path(value).is_absolute():
        return value
    return str(base_dir / value)


LAYOUT_KEYS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "pipeline_model_parallel_layout",
               "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def _splits_evenly(data: dict[str, Any]) -> bool:
    """``pipeline_layout.splits_evenly`` of the row's bundled card and plain whole-number pp and vpp (or their
    defaults of 1): no uneven layout to assume. False where that is not plain (a path, an inline card, other
    spellings): the caller then parses the row."""
    model, t = data.get("model"), data.get("training") or {}
    pp, vpp = str(t.get("pp", 1)).strip(), str(t.get("vpp", 1)).strip()
    if not isinstance(model, str) or not pp.isdigit() or not vpp.isdigit():
        return False
    from oracle.model_card import is_bundled_model, load_model
    from oracle.pipeline_layout import splits_evenly
    return is_bundled_model(model) and splits_evenly(load_model(model).pipeline_layers, int(pp), int(vpp))


def _assume_recipe_layout(data: dict[str, Any], row: dict[str, str]) -> list[str]:
    """A row that states no pipeline layout while its layers do not divide pp*vpp ran with the uneven
    layout of the framework's recipe (oracle.pipeline_layout.recipe_layout; docs/accuracy.md "Uneven
    pipeline layouts assumed for published rows"): set it in ``data`` and return the ``assumed`` note."""
    from oracle.pipeline_layout import recipe_layout
    if _splits_evenly(data):
        return []  # what recipe_layout answers for an even split, without parsing the whole row
    try:
        probe = RunConfig.from_dict(data, where=f"row {row.get('id')}", check=False)
    except PrimusError:
        return []  # the checked parse reports it
    t, m = probe.training, probe.model
    if t.pp < 1 or t.vpp < 1 or t.pp * t.vpp > m.pipeline_layers + m.mtp_layers + 2:
        return []  # no recipe has more virtual stages than layer slots (the checked parse says what is wrong)
    found = recipe_layout(m.pipeline_layers, t.pp, t.vpp, m.mtp_layers)
    if found is None:
        return []
    keys, rule = found
    if t.framework == "torchtitan":  # the rules are read off Megatron's recipes
        rule += "; a TorchTitan run may split its stages otherwise"
    data["training"].update(keys)
    shown = ", ".join(f"{k}={'true' if v is True else v}" for k, v in keys.items())
    return [f"{shown} ({rule})"]


_NO_MTP = re.compile(r"variant=w/o MTP\b", re.IGNORECASE)
_TOKEN_DROP = re.compile(r"variant=token[-_ ]?drop\b", re.IGNORECASE)
TOKEN_DROP_ASSUMED = {"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True}
"""What ``variant=tokendrop`` is priced as when a row gives no factor: capacity 1.0, padded (Megatron-Core's
drop-and-pad path, static expert shapes). Neither the factor nor the padding is published in the tables."""


def _published_token_drop(training: dict[str, Any], row: dict[str, str]) -> list[str]:
    """A row whose notes say ``variant=tokendrop`` (NVIDIA's 25.09 MoE tables publish token-drop and
    dropless runs side by side) trains a capacity-factor MoE: the keys the row leaves unstated get
    TOKEN_DROP_ASSUMED, named in its ``assumed``."""
    if not _TOKEN_DROP.search(row.get("notes") or ""):
        return []
    keys = {k: v for k, v in TOKEN_DROP_ASSUMED.items() if k not in training}
    if not keys:
        return []
    training.update(keys)
    shown = ", ".join(f"{k}={'true' if v is True else v}" for k, v in keys.items())
    return [f"{shown} (the row's notes: variant=tokendrop; the capacity factor and padding are not published: "
            f"{TOKEN_DROP_GUESS})"]


# Published tables spell a setting their own way; each spelling maps onto the oracle's value, and the
# row's ``assumed`` says so. Keys are loose (lower case, no punctuation). A spelling not listed stays
# as published, and the config's own check names it with the valid values.
PUBLISHED_SPELLINGS: dict[str, dict[str, tuple[str, str]]] = {
    "precision": {
        **{k: ("bf16", "") for k in ("bf16", "bf16mixed", "bfloat16", "bf16amp", "amp")},
        # fp16 runs at the bf16 tensor-core rate with the same bytes on every bundled part (loss scaling aside)
        **{k: ("bf16", "fp16 priced as bf16: same tensor rate and bytes") for k in ("fp16", "fp16mixed", "16mixed",
                                                                                     "float16", "half")},
        # FP8 recipes (per-tensor current/delayed scaling, MXFP8, blockwise): precision fp8, and the recipe a
        # spelling names goes to fp8_recipe (FP8_RECIPE_SPELLINGS)
        **{k: ("fp8", "") for k in (
            "fp8", "float8", "fp8cs", "fp8currentscaling", "fp8delayed", "fp8delayedscaling", "fp8tensorwise",
            "fp8rowwise", "fp8blockwise", "fp8hybrid", "mxfp8", "fp8mx", "fp8mxfp8", "fp8e4m3")},
        **{k: ("nvfp4", "") for k in ("nvfp4", "fp4")},
    },
    "moe_a2a_backend": {
        **{k: ("alltoall", "") for k in ("alltoall", "a2a", "nccl", "ncclalltoall")},
        # Megatron's flex dispatcher runs DeepEP (HybridEP on NVL72): one copy per destination, fused permute
        **{k: ("deepep", "the flex dispatcher priced as DeepEP") for k in ("deepep", "flex", "flexdeepep", "hybridep",
                                                                           "flexhybridep")},
        "allgather": ("alltoall", "the allgather dispatcher priced as alltoall (not modelled separately)"),
    },
    "recompute": {
        **{k: ("none", "") for k in ("none", "no", "off", "false", "0")},
        # Megatron's --recompute-method block/uniform are ways to place *full* recompute over the layers
        **{k: ("full", "recompute method block/uniform is full-layer recompute") for k in ("full", "block", "uniform")},
        **{k: ("full", "activation checkpointing of whole layers") for k in ("fullac", "ac", "checkpoint",
                                                                           "activationcheckpointing")},
        "selective": ("selective", ""),
        # TorchTitan's selective_ac_option="op" (its op-level checkpointing; Megatron's under framework=megatron)
        **{k: ("selective", "TorchTitan's op-level selective checkpointing") for k in ("op", "selectiveop", "opsac",
                                                                                      "sac", "selectiveopac")},
    },
    "cuda_graph_impl": {
        **{k: ("none", "") for k in ("none", "no", "off", "false", "0", "eager")},
        **{k: ("transformer_engine", "") for k in ("transformerengine", "te", "tegraphs", "tecudagraph")},
        **{k: ("local", "") for k in ("local", "mcore", "megatron", "megatroncore")},
    },
}


def _published_spellings(training: dict[str, Any]) -> list[str]:
    """Map published spellings of precision, dispatcher and recompute onto the oracle's values (a precision
    spelling that names an FP8 recipe, MXFP8 or FP8-CS, also sets fp8_recipe unless the row states one)."""
    notes = []
    for key, table in PUBLISHED_SPELLINGS.items():
        v = training.get(key)
        if not isinstance(v, str):
            continue
        norm = re.sub(r"[^a-z0-9]", "", v.lower())
        hit = table.get(norm)
        if key == "precision" and hit is not None and hit[0] == "fp8" and "fp8_recipe" not in training:
            recipe = _fp8_recipe_named(norm)
            if recipe is not None:
                training["fp8_recipe"] = recipe
                notes.append(f"fp8_recipe={recipe} (published precision {v!r})")
        if hit is None or hit[0] == v:
            continue
        training[key] = hit[0]
        notes.append(f"{key}={hit[0]} (published {v!r}" + (f": {hit[1]})" if hit[1] else ")"))
    return notes


FP8_RECIPE_SPELLINGS: tuple[tuple[str, str], ...] = (
    (r"mx", "mxfp8"), (r"block", "blockwise"), (r"delayed", "delayed"),
    (r"cs|current|tensorwise|pertensor", "tensorwise"))
"""How a precision or recipe spelling names an FP8 recipe (lower case, punctuation removed): MXFP8 / fp8-mx,
blockwise, delayed scaling, current scaling (per-tensor)."""
_NOTES_RECIPE = re.compile(r"fp8_recipe\s*=\s*([A-Za-z0-9_\-]+)")


def _fp8_recipe_named(spelling: str) -> str | None:
    """The FP8 recipe a spelling names (FP8_RECIPE_SPELLINGS), or None."""
    norm = re.sub(r"[^a-z0-9]", "", spelling.lower())
    return next((r for pat, r in FP8_RECIPE_SPELLINGS if re.search(pat, norm)), None)


def _published_fp8_recipe(training: dict[str, Any], row: dict[str, str]) -> list[str]:
    """An FP8 row's scaling recipe: the ``fp8_recipe=`` its notes publish (NVIDIA's tables: mxfp8, current
    scaling), else Megatron's default (delayed), said in ``assumed``."""
    if "fp8_recipe" in training or str(training.get("precision", "")).lower() != "fp8":
        return []
    m = _NOTES_RECIPE.search(row.get("notes") or "")
    recipe = _fp8_recipe_named(m.group(1)) if m else None
    if recipe is not None:
        training["fp8_recipe"] = recipe
        return [f"fp8_recipe={recipe} (the row's notes: fp8_recipe={m.group(1)})"]
    training["fp8_recipe"] = "delayed"
    return ["fp8_recipe=delayed (no recipe published: Megatron-Core's default)"]


_TORCHTITAN = re.compile(r"torch\s*titan", re.IGNORECASE)
_COMPILED = re.compile(r"torch\.compile|\bcompile(?:d)?\b(?!\s*[=:]\s*(?:false|0|off|no)\b)", re.IGNORECASE)
_NOT_COMPILED = re.compile(r"\b(?:no|without|w/o)[\s_-]*(?:torch\.)?compile|\beager\b|compile\s*[=:]\s*(?:false|0|off|no)\b",
                           re.IGNORECASE)


def _published_framework(training: dict[str, Any], row: dict[str, str]) -> list[str]:
    """The training stack a row names without a ``framework`` cell: a row whose source, table or notes
    name TorchTitan ran TorchTitan's PyTorch-native kernels (and its defaults: FSDP2, fp32 gradient
    reduction), compiled when its notes say torch.compile; any other row is priced as Megatron-Core."""
    if "framework" in training:
        return []
    text = " ".join(row.get(k) or "" for k in ("source", "group", "notes"))
    if not _TORCHTITAN.search(text):
        return []
    training["framework"] = "torchtitan"
    notes = ["framework=torchtitan (the row's source names TorchTitan)"]
    if "torch_compile" not in training:
        compiled = bool(_COMPILED.search(row.get("notes") or "")) and not _NOT_COMPILED.search(row.get("notes") or "")
        training["torch_compile"] = compiled
        notes.append(f"torch_compile={str(compiled).lower()} (the notes {'say' if compiled else 'do not say'} "
                     f"torch.compile)")
    unstated = {k: v for k, v in FRAMEWORK_DEFAULTS["torchtitan"].items() if k not in training}
    if unstated:
        notes.append(", ".join(f"{k}={str(v).lower()}" for k, v in unstated.items()) + " (TorchTitan's defaults)")
    return notes


def _published_variant(data: dict[str, Any], row: dict[str, str]) -> list[str]:
    """Variants a row's notes publish that change the model itself: ``variant=w/o MTP`` trains a card
    that has multi-token-prediction layers without them (NVIDIA's DeepSeek-V3 tables publish both)."""
    if not _NO_MTP.search(row.get("notes") or ""):
        return []
    from oracle.model_card import load_model
    try:
        card = load_model(data["model"])
    except PrimusError:
        return []  # the checked parse reports it
    if not card.mtp_layers:
        return []
    data["model"] = {**card.to_dict(), "mtp_layers": 0, "name": f"{card.name}-no-mtp"}
    return ["mtp_layers=0 (the row's notes: variant=w/o MTP)"]


def _assume_cross_domain_dispatcher(data: dict[str, Any], row: dict[str, str]) -> list[str]:
    """A MoE row that states no dispatcher and whose expert-parallel group leaves the scale-up domain ran
    the flex dispatcher (DeepEP: one RDMA copy per destination node, forwarded over NVLink). Physics,
    not taste: NCCL all-to-all sends every top-k copy over the NIC, and on such rows that alone takes
    longer than the published iteration (docs/accuracy.md, "Unstated dispatcher across domains"). Inside one domain
    the row keeps the NCCL default."""
    from oracle.comm.topology import Topology
    from oracle.layout import Layout
    try:
        run = RunConfig.from_dict(data, where=f"row {row.get('id')}")
    except PrimusError:
        return []  # the checked parse reports it
    if not run.model.is_moe or run.training.ep <= 1:
        return []
    topo = Topology.from_profile(run.cluster.hardware, run.cluster.num_gpus)
    placed = topo.place(Layout(run).group("ep"))
    if placed.num_domains <= 1:
        return []
    data["training"]["moe_a2a_backend"] = "deepep"
    return [f"moe_a2a_backend=deepep (the EP group of {run.training.ep} spans {placed.num_domains} scale-up "
            f"domains: NCCL all-to-all could not reach the published rate; Megatron-Bridge runs the flex "
            f"dispatcher there)"]


def _assume_least_recompute(data: dict[str, Any], row: dict[str, str]) -> list[str]:
    """A row that states no recompute and does not fit in memory without it must have run with some
    memory setting the table does not print: the published run trained, so it fit. Take the setting
    that fits at the least cost, as a tuned recipe would. Candidates: FP8 parameters
    (``fp8_param_gather``, Megatron-Bridge's MXFP8 recipes; FP8 rows with the distributed optimizer
    only), alone or with recompute; Megatron's module recompute (every minimal set of
    ``recompute_modules`` the model has that fits; a superset of a fitting set only costs more); full
    recompute of the fewest layers per pipeline rank that fits (Megatron's 'block' method). Of those
    that fit, the fastest projection wins. Set it in ``data`` and return the ``assumed`` note; [] when
    the row fits as it is or nothing fits (the projection then says ``fits: false``).
    docs/accuracy.md, "Unstated memory settings"."""
    import itertools

    from oracle.memory import project_memory
    from oracle.opgraph import RECOMPUTE_MODULES
    from oracle.projector import project
    where = f"row {row.get('id')}"

    def with_keys(keys: dict[str, Any]) -> RunConfig | None:
        try:
            return RunConfig.from_dict({**data, "training": {**data["training"], **keys}}, where=where)
        except PrimusError:
            return None  # a module this model does not have, a layer count this layout cannot recompute

    projected: dict[int, Any] = {}

    def fits(run: RunConfig | None) -> bool:
        # the closed-form in-flight count first (cheap); a candidate it passes must also fit with the
        # schedule simulator's count, which the row's projection reports (interleaved warm-ups differ)
        if run is None or not project_memory(run, trees="none").fits:
            return False
        projected[id(run)] = p = project(run, fast_schedules=True, memory_tree=False)
        return p.fits

    base = with_keys({})
    if base is None:
        return []  # the checked parse reports it
    if fits(base):
        return []
    base_mem = projected[id(base)].memory if id(base) in projected else project_memory(base, trees="none")
    memory_opts: list[dict[str, Any]] = [{}]  # data["training"] holds only the cells the row states
    if "fp8_param_gather" not in data["training"] and with_keys({"fp8_param_gather": True}) is not None:
        memory_opts.append({"fp8_param_gather": True})
    fitting: list[tuple[dict[str, Any], RunConfig]] = []
    valid = [mod for mod in RECOMPUTE_MODULES if with_keys({"recompute": "selective", "recompute_modules": [mod]})]
    per_rank = max(1, -(-base.model.num_layers // base.training.pp))
    for opt in memory_opts:
        alone = with_keys(opt) if opt else None
        if fits(alone):
            fitting.append((opt, alone))
            continue  # recompute on top of it only costs more
        minimal: list[set[str]] = []
        for size in range(1, len(valid) + 1):
            for combo in itertools.combinations(valid, size):
                if any(m_ <= set(combo) for m_ in minimal):
                    continue
                keys = {**opt, "recompute": "selective", "recompute_modules": list(combo)}
                run = with_keys(keys)
                if fits(run):
                    minimal.append(set(combo))
                    fitting.append((keys, run))
        for n in [*range(1, per_rank), None]:
            keys = {**opt, "recompute": "full", **({} if n is None else {"recompute_num_layers": n})}
            run = with_keys(keys)
            if fits(run):
                fitting.append((keys, run))
                break
    if not fitting:
        return []
    keys, _ = max(fitting, key=lambda kr: projected[id(kr[1])].tokens_per_s_per_gpu)
    data["training"].update(keys)
    shown = ", ".join(f"{k}={'+'.join(v) if isinstance(v, list) else str(v).lower()}" for k, v in keys.items())
    return [f"{shown} ({RECOMPUTE_GUESS} of {len(fitting)} candidates: without it the run needs "
            f"{base_mem.peak_bytes / GIB:.1f} of {base_mem.cap_bytes / GIB:.1f} GiB)"]


@dataclass(frozen=True, slots=True)
class RowRun:
    """What validate projects for one row, and how it got there."""

    run: RunConfig | None
    assumed: list[str]
    """Settings the row does not state, with the value taken and why."""
    skip: str | None
    """Why the row cannot be projected (None when it can)."""
    recipe: tuple[Any, ...] = ()
    """The row's recipe settings (oracle.recipe.RecipeEntry), each priced or ignored with why."""


def row_to_run(row: dict[str, str], base_dir: Path | None = None) -> tuple[RunConfig | None, list[str], str | None]:
    """(run, assumed keys, skip reason) for one CSV row; ``base_dir`` resolves relative card paths."""
    r = read_row(row, base_dir)
    return r.run, r.assumed, r.skip


def _cell_value(key: str, value: Any) -> Any:
    """A cell or recipe value as the training config reads it (for comparing the two)."""
    from oracle.schema import coerce
    hints = _TRAINING_HINTS()
    try:
        return coerce(value, hints[key], key)
    except (ValueError, KeyError):
        return value


_HINTS_CACHE: dict[str, Any] = {}


def _TRAINING_HINTS() -> dict[str, Any]:
    if not _HINTS_CACHE:
        import typing
        _HINTS_CACHE.update(typing.get_type_hints(TrainingConfig, include_extras=True))
    return _HINTS_CACHE


def _published_recipe(training: dict[str, Any], row: dict[str, str]) -> tuple[list[Any], dict[str, Any]]:
    """The row's ``recipe`` cell (oracle.recipe) merged under its columns: a column the row prints wins over
    the recipe (the table printed what ran), the recipe fills what the columns leave empty. Returns the
    recipe's entries (a conflicting setting becomes ignored, naming the column) and the keys it set."""
    from oracle.recipe import IGNORED, RecipeEntry, read_recipe
    text = (row.get("recipe") or "").strip()
    if not text:
        return [], {}
    try:
        reading = read_recipe(text, lenient=True)  # a setting it cannot read is listed as ignored, the rest priced
    except InvalidConfigError as exc:  # the cell itself (its key=value;... form) unreadable
        raise InvalidConfigError(f"recipe cell: {exc}") from None
    entries = list(reading.entries)
    took: dict[str, Any] = {}
    for key, value in reading.training.items():
        if key in training:
            stated = _cell_value(key, training[key])
            if stated != _cell_value(key, value):
                entries.append(RecipeEntry(key, value, IGNORED, f"the row's {key} column says {training[key]}"))
            continue
        training[key] = value
        took[key] = value
    return entries, took


def read_row(row: dict[str, str], base_dir: Path | None = None) -> RowRun:
    """The run validate projects for one CSV row, what it assumed and what its recipe set."""
    training: dict[str, Any] = {}
    assumed: list[str] = []
    for k in TRAINING_KEYS:
        v = (row.get(k) or "").strip()
        if v == "":
            if k in ("seq_len", "gbs"):
                return RowRun(None, assumed, f"{k} is not published for this row (no default exists)")
            continue
        # a list-valued key in one cell: "moe_act+layernorm", "[moe_act, layernorm]" or space-separated
        training[k] = [x for x in re.split(r"[\s,+\[\]]+", v) if x] if k in LIST_KEYS else v
    ng = (row.get("num_gpus") or "").strip()
    if not ng:
        return RowRun(None, assumed, "num_gpus is not published")
    try:
        num_gpus = int(float(ng))
    except (ValueError, OverflowError):  # 'abc', 'nan'; 'inf', '1e400'
        return RowRun(None, assumed, f"num_gpus={clip(repr(ng), 80)} is not a whole number of GPUs")
    data = {"model": _resolve((row.get("model") or "").strip(), base_dir),  # a short row's missing cells are None
            "cluster": {"hardware": _resolve((row.get("hardware") or "").strip(), base_dir), "num_gpus": num_gpus},
            "training": training}
    assumed += _published_spellings(training)
    try:
        recipe, from_recipe = _published_recipe(training, row)
    except InvalidConfigError as exc:
        return RowRun(None, assumed, str(exc))
    has_recipe = bool(recipe)
    if "mtp_num_layers" in from_recipe and _NO_MTP.search(row.get("notes") or ""):
        from oracle.recipe import IGNORED, RecipeEntry
        recipe.append(RecipeEntry("mtp_num_layers", training.pop("mtp_num_layers"), IGNORED,
                                  "the row's notes: variant=w/o MTP"))
        del from_recipe["mtp_num_layers"]
    assumed += _published_framework(training, row)
    assumed += _published_fp8_recipe(training, row)
    assumed += _published_variant(data, row)
    assumed += _published_token_drop(training, row)
    if not any(k in training for k in LAYOUT_KEYS):
        assumed += _assume_recipe_layout(data, row)
    if "moe_a2a_backend" not in training:
        assumed += _assume_cross_domain_dispatcher(data, row)
    # a recipe states every memory setting it changed (an absent key ran the framework default): nothing to guess
    if not has_recipe and "recompute" not in training and "recompute_num_layers" not in training:
        assumed += _assume_least_recompute(data, row)
    run, recipe, skip = _legal_with_recipe(data, row, recipe, from_recipe, assumed)
    if skip is not None:
        return RowRun(None, assumed, skip, tuple(recipe))
    unstated = [k for k in TRAINING_KEYS if k in row and not (row.get(k) or "").strip() and k not in training]
    return RowRun(run, unstated + assumed, None, tuple(recipe))


def _legal_with_recipe(data: dict[str, Any], row: dict[str, str], recipe: list[Any], from_recipe: dict[str, Any],
                       assumed: list[str]) -> tuple[RunConfig | None, list[Any], str | None]:
    """Parse ``data``; where only recipe-set keys make it illegal (a recipe read from a release whose code
    does not reproduce the printed layout), drop those keys, each listed as ignored with the problem; a dropped
    pipeline layout drops the recipe's other layout keys too and takes the framework's uneven rule instead
    (``_assume_recipe_layout``, said in ``assumed``)."""
    from oracle.recipe import IGNORED, RecipeEntry
    where = f"row {row.get('id')}"
    dropped: list[Any] = []
    for _ in range(len(from_recipe) + 1):
        try:
            return RunConfig.from_dict(data, where=where), recipe + dropped, None
        except PrimusError as exc:
            problems = getattr(exc, "problems", None) or [str(exc)]
            culprits = [k for k in from_recipe if k in data["training"]
                        and any(re.search(rf"\b{re.escape(k)}\b", p) for p in problems)]
            if not culprits:
                return None, recipe + dropped, "; ".join(str(exc).splitlines())
            if any(k in LAYOUT_KEYS for k in culprits):
                culprits += [k for k in from_recipe if k in LAYOUT_KEYS and k in data["training"] and k not in culprits]
            for k in culprits:
                why = next((p for p in problems if re.search(rf"\b{re.escape(k)}\b", p)), problems[0])
                what = "the row's printed layout" if k in LAYOUT_KEYS else "the row's other settings"
                dropped.append(RecipeEntry(k, data["training"].pop(k), IGNORED, f"illegal with {what}: {clip(why, 160)}"))
            if any(k in LAYOUT_KEYS for k in culprits) and not any(k in data["training"] for k in LAYOUT_KEYS):
                assumed += _assume_recipe_layout(data, row)
    return None, recipe + dropped, "the recipe's settings could not be made legal"


def validate_rows(rows: list[dict[str, str]], project_fn=None, base_dir: str | Path | None = None, *,
                  jobs: int = 1) -> list[RowResult]:
    """Project every row; ``base_dir`` (the CSV's folder) resolves relative model-card/profile paths.
    Without ``project_fn`` the rows' runs are projected together (``oracle.projector.project_many``);
    ``jobs`` > 1 splits the rows over that many forked processes (0: every core), same results."""
    base = Path(base_dir) if base_dir is not None else None
    jobs = (os.cpu_count() or 1) if jobs == 0 else max(1, int(jobs))
    if jobs > 1 and len(rows) > 1:
        import concurrent.futures as cf
        import multiprocessing as mp
        size = -(-len(rows) // jobs)
        chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
        with cf.ProcessPoolExecutor(len(chunks), mp_context=mp.get_context("fork")) as pool:
            out = [r for part in pool.map(_row_results, chunks, [base] * len(chunks), [project_fn] * len(chunks))
                   for r in part]
    else:
        out = _row_results(rows, base, project_fn)
    return [dataclasses.replace(r, release=release_of(row), newest=newest)
            for r, row, newest in zip(out, rows, newest_flags(rows))]


@bulk_pass()  # a bulk process collects nothing while it reads and projects the rows (oracle/collector.py)
def _row_results(rows: list[dict[str, str]], base: Path | None, project_fn: Any) -> list[RowResult]:
    """Each row's result (release and newest flags are set by the caller, over every row)."""
    out: list[Any] = []
    todo: list[tuple[int, RunConfig, tuple[str, ...], str, float | None, float | None]] = []
    for row in rows:
        rid = (row.get("id") or "").strip()
        group = (row.get("group") or "").strip()
        quality = (row.get("quality") or "").strip()
        try:
            tps = _num(row.get("measured_tokens_per_s_per_gpu", ""))
            tfl = _num(row.get("measured_tflops_per_gpu", ""))
            mem = _num(row.get("measured_peak_mem_gib", ""))
        except ValueError as exc:
            out.append(RowResult(id=rid, group=group, quality=quality, quantity=None, measured=None,
                                 skipped=f"bad measured value: {exc}"))
            continue
        quantity = "tokens_per_s_per_gpu" if tps is not None else ("tflops_per_gpu" if tfl is not None else None)
        measured = tps if tps is not None else tfl
        rr = read_row(row, base)
        run, assumed, skip = rr.run, rr.assumed, rr.skip
        recipe = {"recipe_priced": tuple(e.describe() for e in rr.recipe if e.status == "priced"),
                  "recipe_ignored": tuple(e.describe() for e in rr.recipe if e.status == "ignored"),
                  "model": (row.get("model") or "").strip()}
        if quantity is None and skip is None:
            skip = "no measured throughput in this row"
        if skip is not None:
            out.append(RowResult(id=rid, group=group, quality=quality, quantity=quantity, measured=measured,
                                 skipped=skip, measured_peak_mem_gib=mem, assumed=tuple(assumed), **recipe))
            continue
        assert run is not None and quantity is not None
        todo.append((len(out), run, tuple(assumed), quantity, measured, mem))
        out.append(RowResult(id=rid, group=group, quality=quality, quantity=quantity, measured=measured, **recipe))
    if project_fn is None:
        from oracle.projector import project_many
        projections = project_many([t[1] for t in todo], memory_tree=False)  # nothing here reads a module tree
    else:
        projections = [project_fn(t[1]) for t in todo]
    for (i, _run, assumed, quantity, measured, mem), proj in zip(todo, projections):
        projected = proj.tokens_per_s_per_gpu if quantity == "tokens_per_s_per_gpu" else proj.tflops_per_gpu
        err = projected / measured - 1.0 if measured else None
        out[i] = dataclasses.replace(out[i], projected=projected, error=err, fits=proj.fits,
                                     projected_peak_gib=proj.memory.peak_bytes / GIB, measured_peak_mem_gib=mem,
                                     assumed=assumed, projection=proj)
    return out


BATCH_AXES = ("mbs", "gbs")


def batch_contrasts(results: list[RowResult]) -> list[dict[str, Any]]:
    """Pairs of projected rows of one group whose configurations differ only in the batch axes
    (mbs, gbs) and which measured the same quantity. The measured ratio of such a pair isolates what a
    micro-batch costs besides its tokens, and whatever a sweep holds fixed but does not publish cancels
    in it. Each entry: {"a", "b" (the larger-mbs row), "group", "measured", "projected" (ratio - 1 of
    a over b), "fits" (both rows fit in memory)}."""
    keyed = []
    for r in results:
        if r.skipped is not None or r.projection is None or r.measured is None:
            continue
        cfg = dict(r.projection.config)
        cfg["training"] = {k: v for k, v in cfg["training"].items() if k not in BATCH_AXES}
        keyed.append((r, repr(sorted(cfg.items(), key=str)), r.projection.config["training"]["mbs"]))
    out = []
    for i, (r1, k1, mbs1) in enumerate(keyed):
        for r2, k2, mbs2 in keyed[i + 1:]:
            if r1.group != r2.group or k1 != k2 or mbs1 == mbs2 or r1.quantity != r2.quantity:
                continue
            a, b = (r1, r2) if mbs1 > mbs2 else (r2, r1)
            out.append({"a": a.id, "b": b.id, "group": a.group, "measured": a.measured / b.measured - 1.0,
                        "projected": a.projected / b.projected - 1.0, "fits": bool(a.fits and b.fits)})
    return out


def _rank_stats(pairs: list[tuple[float, float]]) -> dict[str, float | None]:
    from oracle.offset import rank_correlations
    if len(pairs) < 3:
        return {"spearman": None, "kendall": None, "regret": None}
    meas = [p[0] for p in pairs]
    proj = [p[1] for p in pairs]
    rho, tau = rank_correlations(meas, proj)
    pick = max(range(len(pairs)), key=lambda i: proj[i])
    return {"spearman": rho, "kendall": tau, "regret": 1.0 - meas[pick] / max(meas)}


def _abs_stats(errs: list[float]) -> dict[str, Any]:
    a = [abs(e) for e in errs]
    return {"n": len(a), "median_abs_error": statistics.median(a) if a else None,
            "mean_abs_error": statistics.fmean(a) if a else None, "max_abs_error": max(a) if a else None,
            "within_10pct": sum(1 for x in a if x <= 0.10) / len(a) if a else None}


def headline(results: list[RowResult], groups: dict[str, Any]) -> dict[str, Any]:
    """The figures a reader checks first: share of rows projected; over the newest release of each
    configuration the median |error|, share within 10% and the worst row; the median over published
    tables (groups with >= 3 projected rows) of the per-table Spearman rank correlation."""
    done = [r for r in results if r.skipped is None and r.error is not None]
    newest = [r for r in done if r.newest]
    newest_a = [r for r in newest if r.quality == "A"]
    every_a = [r for r in done if r.quality == "A"]

    def worst(rs: list[RowResult]) -> dict[str, Any] | None:
        w = max(rs, key=lambda r: abs(r.error), default=None)  # type: ignore[arg-type]
        return None if w is None else {"id": w.id, "error": w.error}
    rhos = [g["spearman"] for g in groups.values() if g.get("spearman") is not None]
    return {"rows": len(results), "projected": len(done), "projected_share": len(done) / len(results) if results else None,
            "newest": _abs_stats([r.error for r in newest]), "worst_newest": worst(newest),
            "newest_A": _abs_stats([r.error for r in newest_a]), "worst_newest_A": worst(newest_a),
            "every_A": _abs_stats([r.error for r in every_a]), "worst_every_A": worst(every_a),
            "tables_ranked": len(rhos), "spearman_median": statistics.median(rhos) if rhos else None,
            "spearman_min": min(rhos) if rhos else None}


def by_model(results: list[RowResult]) -> dict[str, Any]:
    """Per model (the row's model cell): the figures over its projected rows, over its quality-A rows and over
    the newest release of its quality-A configurations, with the median signed error (a direction, not noise)."""
    done = [r for r in results if r.skipped is None and r.error is not None]
    out: dict[str, Any] = {}
    for m in sorted({r.model for r in done}):
        rs = [r for r in done if r.model == m]
        a = [r for r in rs if r.quality == "A"]
        na = [r for r in a if r.newest]
        out[m] = {"all": _abs_stats([r.error for r in rs]), "every_A": _abs_stats([r.error for r in a]),
                  "newest_A": _abs_stats([r.error for r in na]),
                  "median_signed_every_A": statistics.median([r.error for r in a]) if a else None}
    return out


def summarize(results: list[RowResult]) -> dict[str, Any]:
    done = [r for r in results if r.skipped is None and r.error is not None]
    groups: dict[str, Any] = {}
    for g in sorted({r.group for r in done}):
        rs = [r for r in done if r.group == g]
        same_q = len({r.quantity for r in rs}) == 1
        stats = _abs_stats([r.error for r in rs])
        stats.update(_rank_stats([(r.measured, r.projected) for r in rs]) if same_q else
                     {"spearman": None, "kendall": None, "regret": None})
        stats["quality"] = "".join(sorted({r.quality for r in rs}))
        groups[g] = stats
    by_quality = {q: _abs_stats([r.error for r in done if r.quality == q]) for q in sorted({r.quality for r in done})}
    ab = [r.error for r in done if r.quality in ("A", "B")]
    summary = {"all": _abs_stats([r.error for r in done]), "quality_AB": _abs_stats(ab), "by_quality": by_quality,
               "skipped": sum(1 for r in results if r.skipped), "rows": len(results)}
    summary["headline"] = headline(results, groups)
    summary["by_model"] = by_model(results)
    return {"summary": summary, "groups": groups, "contrasts": batch_contrasts(results)}
