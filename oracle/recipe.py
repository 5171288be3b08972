"""A run's recipe in Megatron-Core / Megatron-Bridge words, read onto the training config (and written back).

A *recipe* is what a launch sets beyond the model card and the cluster: the parallel layout, the overlap and
fusion switches, CUDA graphs, the MoE dispatcher, FP8 options, recompute, offloading. It comes in three
spellings, all read here by one table (``SETTINGS``):

* ``key=value;key=value`` - the ``recipe`` column of ../shared/validation/published-nvidia.csv, read from the
  releases' own Megatron-Bridge performance scripts (``recipes.md`` there);
* a mapping - a config file's ``recipe:`` section (same names);
* a Megatron-LM command line - ``--tensor-model-parallel-size 4 --overlap-moe-expert-parallel-comm ...``
  (``raytune-primus project --megatron-args``).

Names are Megatron-Core's config fields (TransformerConfig, ModelParallelConfig, DistributedDataParallelConfig,
OptimizerConfig), Megatron-Bridge's (``comm_overlap.*``, ``ddp.*``, ``mixed_precision.*``, workload flags) or
Megatron-LM's command-line flags (dashes for underscores). Every key is accounted for: ``priced`` (it sets a
training value the projection uses, or states what the projection already assumes) or ``ignored`` with the
reason (a launcher environment variable, an inference-only switch, a setting this model does not price).
Nothing is dropped silently. ``megatron_args`` inverts the mapping for ``export --to megatron``.
"""
from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oracle.errors import InvalidConfigError, clip
from oracle.opgraph import ATTENTION_BACKENDS
from oracle.schema import coerce

PRICED, IGNORED = "priced", "ignored"
UNKNOWN_WHY = "not a setting this projection knows"
"""Why an ignored entry was ignored where its key is none this projection knows (a typo, a newer field)."""


@dataclass(frozen=True, slots=True)
class RecipeEntry:
    """One recipe setting and what became of it."""

    key: str
    """The name as given (``comm_overlap.overlap_moe_expert_parallel_comm``, ``--bf16``, ``env.NCCL_...``)."""
    value: Any
    """The value as read (bools, numbers and lists parsed; a bare command-line flag is True)."""
    status: str
    """``priced`` or ``ignored``."""
    why: str = ""
    """What it set, or why it is ignored."""

    def describe(self) -> str:
        v = show_value(self.value)
        return f"{self.key}={v}" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class RecipeReading:
    """A recipe read onto training-config keys."""

    training: dict[str, Any] = field(default_factory=dict)
    """TrainingConfig keys and values the recipe sets."""
    entries: tuple[RecipeEntry, ...] = ()
    """Every key of the recipe, priced or ignored."""
    model: dict[str, Any] = field(default_factory=dict)
    """Model-card fields the recipe sets on the model (Megatron-Bridge recipes override e.g. ``vocab_size``): the
    run's card is the named one with these values."""

    @property
    def ignored(self) -> tuple[RecipeEntry, ...]:
        return tuple(e for e in self.entries if e.status == IGNORED)

    @property
    def priced(self) -> tuple[RecipeEntry, ...]:
        return tuple(e for e in self.entries if e.status == PRICED)


# ------------------------------------------------------------------------------------------------ values
def show_value(v: Any) -> str:
    """A setting's value as a recipe cell or --set writes it: bools lower-case, lists as [a,b]."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(map(str, v)) + "]"
    return str(v)


def parse_value(text: Any) -> Any:
    """A recipe value as Python: true/false, None, ints, floats, ``[a,b]`` lists, else the string."""
    if not isinstance(text, str):
        return list(text) if isinstance(text, tuple) else text
    v = text.strip()
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if v.startswith("[") and v.endswith("]"):
        inner = v[1:-1].strip()
        return [parse_value(x) for x in re.split(r"\s*,\s*", inner)] if inner else []
    if re.fullmatch(r"[+-]?\d+", v):
        return int(v)
    try:
        return float(v)
    except ValueError:
        return v


def _bool(v: Any, key: str) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.strip().lower() in ("true", "1", "yes")
    raise InvalidConfigError(f"recipe {key}={clip(repr(v), 60)} must be true or false")


def _int(v: Any, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)) \
            or int(v) != v:
        raise InvalidConfigError(f"recipe {key}={clip(repr(v), 60)} must be a whole number")
    return int(v)


def _float(v: Any, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidConfigError(f"recipe {key}={clip(repr(v), 60)} must be a number")
    try:
        return coerce(v, float, f"recipe {key}")  # the config's own rule (an integer past float's range: too large)
    except ValueError as exc:
        raise InvalidConfigError(str(exc)) from None


def _list(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [x for x in re.split(r"[\s,+\[\]]+", v) if x]
    if not isinstance(v, (list, tuple)):  # one value where a list belongs: a list of it (its checks name it)
        return [str(v)]
    return [str(x) for x in v]


# ------------------------------------------------------------------------------------------------ names
PREFIXES = ("workload_base_config.", "model.", "comm_overlap.", "ddp.", "mixed_precision.", "optimizer.", "train.",
            "dist.", "checkpoint.", "transformer_config.")
"""Megatron-Bridge ConfigContainer sections and perf-script workload prefixes: the field name after them is the
Megatron-Core / Bridge field (a ``ddp.`` field loses to the same bare field set by the mixed-precision recipe)."""

ALIASES: dict[str, str] = {
    # Megatron-LM command-line flags whose names differ from the config fields
    "overlap_moe_expert_parallel_comm": "moe_a2a_overlap",
    "tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp", "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep", "expert_tensor_parallel_size": "etp",
    "virtual_pipeline_model_parallel_size": "vpp", "num_virtual_stages_per_pipeline_rank": "vpp",
    "micro_batch_size": "mbs", "global_batch_size": "gbs", "seq_length": "seq_len", "encoder_seq_length": "seq_len",
    "moe_enable_deepep": "moe_enable_deepep", "moe_deepep_num_sms": "moe_flex_dispatcher_num_sms",
    "moe_hybridep_num_sms": "moe_flex_dispatcher_num_sms", "cuda_graph_modules": "cuda_graph_scope",
    # TransformerConfig.fp8_param / fp4_param are Megatron-LM's --fp8-param-gather / --fp4-param-gather
    "fp8_param": "fp8_param_gather", "fp4_param": "fp4_param_gather",
    "defer_embedding_wgrad_compute": "defer_embedding_wgrad", "cross_entropy_loss_fusion": "loss_fusion",
    "recompute_activations": "recompute_activations", "moe_paged_stash_buffer_size_factor_cuda":
        "moe_paged_stash_buffer_factor", "decoder_first_pipeline_num_layers": "decoder_first_pipeline_num_layers",
    "overlap_grad_reduce": "overlap_grad_reduce", "moe_a2a_overlap": "moe_a2a_overlap",
}
"""Other names of a setting -> the name SETTINGS knows it by."""


def canonical(key: str) -> str:
    """A setting's canonical name: prefixes stripped, dashes as underscores, aliases resolved."""
    k = key.strip().lstrip("-").replace("-", "_")
    for pre in PREFIXES:
        if k.startswith(pre):
            k = k[len(pre):]
            break
    return ALIASES.get(k, k)


# ------------------------------------------------------------------------------------------------ the table
Handler = Callable[[Any, str, dict[str, Any], dict[str, Any]], str]
"""(value, key as given, training out, every canonical setting) -> what it priced; raise _Ignore(why) to ignore."""


class _Ignore(Exception):
    """A setting that prices nothing, with the reason."""


def _set(key: str, conv: Callable[[Any, str], Any] = lambda v, k: v, note: str = "") -> Handler:
    """A setting that maps one-to-one onto the TrainingConfig key ``key``."""
    def handler(v: Any, given: str, out: dict[str, Any], _all: dict[str, Any]) -> str:
        out[key] = conv(v, given)
        return note or (f"training.{key}" if key != canonical(given) else "")
    return handler


def _same(expected: Any, why: str, other: str) -> Handler:
    """A setting the projection prices only at ``expected`` (what it assumes): other values are ignored."""
    def handler(v: Any, given: str, out: dict[str, Any], _all: dict[str, Any]) -> str:
        if v == expected or (isinstance(expected, bool) and _bool(v, given) == expected):
            return why
        raise _Ignore(other)
    return handler


def _ignore(why: str) -> Handler:
    def handler(v: Any, given: str, out: dict[str, Any], _all: dict[str, Any]) -> str:
        raise _Ignore(why)
    return handler


def _flag(key: str) -> Handler:
    return _set(key, _bool)


def _precision_flag(precision: str) -> Handler:
    def handler(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
        if _bool(v, given) and "precision" not in out:
            out["precision"] = precision
            return f"training.precision={precision}"
        raise _Ignore("the mixed-precision base; the FP8/FP4 recipe decides the GEMM precision")
    return handler


def _fp8_format(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if v in (None, False, "none", ""):
        raise _Ignore("no FP8")
    if str(v).lower() not in ("e4m3", "hybrid"):
        raise InvalidConfigError(f"recipe {given}={v!r}: valid FP8 formats are e4m3 and hybrid")
    if out.get("precision") != "nvfp4":
        out["precision"] = "fp8"
    return "training.precision=fp8 (e4m3 and hybrid (e5m2 gradients) run at the same FP8 rate)"


_FP8_RECIPES = {"delayed": "delayed", "tensorwise": "tensorwise", "current_scaling": "tensorwise", "mxfp8": "mxfp8",
                "blockwise": "blockwise"}


def _fp8_recipe(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    name = str(v).lower()
    if name not in _FP8_RECIPES:
        raise InvalidConfigError(f"recipe {given}={v!r}: valid FP8 recipes are {', '.join(_FP8_RECIPES)}")
    fp4_on = "fp4_recipe" in every or every.get("fp4") not in (None, False, "none", "")
    if out.get("precision") == "nvfp4" or (fp4_on and every.get("fp8_format") is None and every.get("fp8") is None):
        raise _Ignore("the run trains in NVFP4 (fp4_recipe): the FP8 recipe scales nothing priced")
    out["precision"] = "fp8"
    out["fp8_recipe"] = _FP8_RECIPES[name]
    return f"training.precision=fp8, fp8_recipe={_FP8_RECIPES[name]}"


def _fp4_recipe(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if str(v).lower() != "nvfp4":
        raise InvalidConfigError(f"recipe {given}={v!r}: the only FP4 recipe is nvfp4")
    out["precision"] = "nvfp4"
    out.pop("fp8_recipe", None)
    return "training.precision=nvfp4"


def _fp4_format(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    # Megatron-Core TransformerConfig.fp4 (--fp4-format): the FP4 element format, whose only value e2m1 turns FP4
    # on; fp4_recipe (default nvfp4) says how it is scaled
    if v in (None, False, "none", ""):
        raise _Ignore("no FP4")
    if str(v).lower() not in ("e2m1", "nvfp4"):
        raise InvalidConfigError(f"recipe {given}={v!r}: the only FP4 format is e2m1")
    if str(every.get("fp4_recipe", "nvfp4")).lower() != "nvfp4":
        raise InvalidConfigError(f"recipe {given}={v!r} with fp4_recipe={every['fp4_recipe']!r}: the only FP4 "
                                 f"recipe priced is nvfp4")
    out["precision"] = "nvfp4"
    out.pop("fp8_recipe", None)
    return "training.precision=nvfp4 (e2m1 elements, scaled as fp4_recipe says: nvfp4)"


def _layout_text(v: Any, given: str) -> str:
    """A pipeline layout as Megatron-Core's string: a Megatron-Bridge list of stages (each a list of layer type
    names, pipeline_parallel_layer_layout.PipelineParallelLayerLayout) is written as its stages joined by '|'."""
    if not isinstance(v, (list, tuple)):
        return str(v)
    chars = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
    stages = []
    for stage in v:
        if not isinstance(stage, (list, tuple)):
            raise InvalidConfigError(f"recipe {given}: a list layout holds one list of layer types per stage, "
                                     f"got {clip(stage)!r}")
        try:
            stages.append("".join(chars[str(t).strip().lower()] for t in stage))
        except KeyError as exc:
            raise InvalidConfigError(f"recipe {given}: layer type {exc.args[0]!r} is not one of "
                                     f"{', '.join(chars)}") from None
    return "|".join(stages)


def _layout(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    text = _layout_text(v, given)
    out["pipeline_model_parallel_layout"] = text
    if every.get("vpp") is None and every.get("pp") is not None:
        # Megatron-Core TransformerConfig: with no virtual_pipeline_model_parallel_size, the layout's stage count
        # over pp sets it
        from oracle.pipeline_layout import parse_layout
        pp, n = _int(every["pp"], "pp"), len(parse_layout(text))
        if pp > 0 and n % pp == 0 and n // pp > 1:
            out["vpp"] = n // pp
            return f"training.vpp={n // pp} (its {n} stages over pp={pp})"
    return ""


def _cp_comm_type(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    # Megatron-Core cp_comm_type: one type, or one per layer (Megatron-LM --cp-comm-type takes a list)
    raw = [str(x) for x in v] if isinstance(v, (list, tuple)) else [] if v is None else [str(v)]
    if any("+" in x for x in raw):
        raise InvalidConfigError(f"recipe {given}={show_value(v)}: the hierarchical a2a+p2p is not priced; valid types "
                                 f"are {', '.join(CP_COMM_TYPES)}")
    kinds = {x.strip().lower().replace("allgather", "all_gather") for x in _list(raw)}
    if not kinds:
        raise _Ignore("unset: Megatron-Core's default p2p")
    if len(kinds) > 1:
        raise InvalidConfigError(f"recipe {given}={show_value(v)}: one communication type per layer is not priced; "
                                 f"give one of p2p, a2a, all_gather for every layer")
    kind = kinds.pop()
    if kind not in CP_COMM_TYPES:
        raise InvalidConfigError(f"recipe {given}={show_value(v)}: valid types are {', '.join(CP_COMM_TYPES)}")
    out["cp_comm_type"] = kind
    return "training.cp_comm_type"


CP_COMM_TYPES = ("p2p", "a2a", "all_gather")


def _fine_grained_offload(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if not _bool(v, given):
        raise _Ignore("off")
    mods = _list(every.get("offload_modules"))
    if not mods:  # Megatron-Core asserts a non-empty list
        raise InvalidConfigError(f"recipe {given}=true needs offload_modules (which modules' saved tensors go to host "
                                 f"memory), got none")
    return "with offload_modules: training.offload_modules"


def _offload_modules(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    mods = _list(v)
    if not _bool(every.get("fine_grained_activation_offloading", False), "fine_grained_activation_offloading"):
        if mods:
            raise _Ignore("fine_grained_activation_offloading is off, and Megatron-Core reads this only with it on")
        raise _Ignore("none")
    out["offload_modules"] = mods
    return "training.offload_modules"


_MODEL = "__model__"
"""Where a handler puts the model-card fields a recipe sets (RecipeReading.model)."""


def _card_field(name: str) -> Handler:
    """A model-card field a recipe sets on the model (Megatron-Bridge perf recipes set ``cfg.model.vocab_size``):
    the run's card is the named one with this value."""
    def handler(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
        n = _int(v, given)
        if n < 1:
            raise InvalidConfigError(f"recipe {given}={v!r} must be a positive whole number")
        out[_MODEL] = {**out.get(_MODEL, {}), name: n}
        return f"the model card's {name}"
    return handler


def _flex_only(key: str, conv: Callable[[Any, str], Any], what: str) -> Handler:
    """A setting of the flex dispatcher (Megatron-Core reads it only under moe_token_dispatcher_type=flex with a
    DeepEP or HybridEP backend): set where the recipe runs that, ignored where it does not."""
    def handler(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
        kind = str(every.get("moe_token_dispatcher_type", "flex")).lower()
        if kind != "flex":
            raise _Ignore(f"{what}; the dispatcher is {kind}, which does not read it")
        if str(every.get("moe_flex_dispatcher_backend", "deepep")).lower() == "ncclep":
            raise _Ignore(f"{what}; the NCCL-EP backend is not priced (see moe_flex_dispatcher_backend)")
        out[key] = conv(v, given)
        return f"training.{key}" if key != canonical(given) else ""
    return handler


def _offload_detail(key: str, conv: Callable[[Any, str], Any]) -> Handler:
    """cpu_offloading_num_layers / _weights: Megatron-Core reads them only with cpu_offloading on."""
    def handler(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
        try:
            on = _bool(every.get("cpu_offloading", False), "cpu_offloading")
        except InvalidConfigError:
            on = True  # cpu_offloading's own handler names the bad value
        if not on:
            raise _Ignore("cpu_offloading is off, and Megatron-Core reads this only with it on")
        out[key] = conv(v, given)
        return ""
    return handler


_BARE_OUTRANKS_DDP = ("grad_reduce_in_fp32", "fp8_param_gather", "fp4_param_gather")
"""Settings Megatron-Bridge's mixed-precision section copies onto the DDP config: where the recipe gives both, the
bare (mixed-precision) one is what ran and the ``ddp.`` copy is ignored."""


def _param_gather(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    # fp8_param_gather and fp4_param_gather both set training.fp8_param_gather (the low-precision weight copies
    # gathered): either on turns it on, the other one off does not turn it off
    which = canonical(given)
    other = "fp4_param_gather" if which == "fp8_param_gather" else "fp8_param_gather"
    if given.startswith("ddp.") and every.get(f"_bare_{which}"):
        raise _Ignore(f"overridden by the mixed-precision recipe's {which}, which Megatron-Bridge copies onto the "
                      f"DDP config")
    on = _bool(v, given)
    if not on and out.get("fp8_param_gather"):
        raise _Ignore(f"off, while {other} gathers the low-precision weights")
    out["fp8_param_gather"] = on
    return "training.fp8_param_gather (FP4 weights under nvfp4)" if which == "fp4_param_gather" else ""


def _recompute_granularity(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    g = "none" if v in (None, False) else str(v).lower()
    if g not in ("none", "full", "selective"):
        raise InvalidConfigError(f"recipe {given}={v!r}: valid granularities are full and selective (or none)")
    mods = every.get("recompute_modules")
    if g == "selective" and mods is not None and not _list(mods):
        out["recompute"] = "none"
        return "training.recompute=none (selective with recompute_modules=[] recomputes nothing)"
    out["recompute"] = g
    return "training.recompute"


def _recompute_modules(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    mods = _list(v)
    if str(every.get("recompute_granularity", "")).lower() != "selective":
        raise _Ignore("recompute_modules apply to selective recompute only, which the recipe does not set")
    if not mods:
        return "recomputes nothing (see recompute_granularity)"
    out["recompute_modules"] = mods
    return "training.recompute_modules"


def _recompute_method(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if str(v).lower() == "block":
        return "full recompute of the first recompute_num_layers layers of each stage (the op graph's rule)"
    if str(v).lower() == "uniform" and every.get("recompute_num_layers") in (None, 1):
        return "uniform with one layer per group: every layer recomputed (as block with all layers)"
    raise _Ignore(f"recompute_method={v}: only 'block' placement is priced (uniform groups of several layers "
                  f"recompute the same count of layers)")


def _recompute_activations(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if _bool(v, given):
        out.setdefault("recompute", "selective")
        return "training.recompute=selective"
    raise _Ignore("off")


def _dispatcher_type(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    kind = str(v).lower()
    if kind == "alltoall":
        out["moe_a2a_backend"] = "alltoall"
        return "training.moe_a2a_backend=alltoall"
    if kind == "flex":
        # Megatron-Core TransformerConfig.moe_flex_dispatcher_backend defaults to deepep
        backend = str(every.get("moe_flex_dispatcher_backend", "deepep")).lower()
        if backend == "ncclep":
            raise _Ignore("the flex dispatcher's NCCL-EP backend is not priced: the dispatcher is priced as the "
                          "training section's moe_a2a_backend")
        if backend not in ("deepep", "hybridep"):
            raise InvalidConfigError(f"recipe {given}=flex: moe_flex_dispatcher_backend={backend!r} is not one of "
                                     "deepep, hybridep, ncclep")
        out["moe_a2a_backend"] = backend
        return f"training.moe_a2a_backend={backend}"
    if kind == "allgather":
        raise _Ignore("the allgather dispatcher is not priced (Megatron's default for MoE recipes is alltoall)")
    raise InvalidConfigError(f"recipe {given}={v!r}: valid dispatchers are alltoall, flex and allgather")


def _flex_backend(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    backend = str(v).lower()
    if backend not in ("deepep", "hybridep", "ncclep"):
        raise InvalidConfigError(f"recipe {given}={v!r}: valid flex backends are deepep, hybridep and ncclep")
    if str(every.get("moe_token_dispatcher_type", "flex")).lower() != "flex":
        raise _Ignore(f"the dispatcher is {every.get('moe_token_dispatcher_type')}, not flex")
    if backend == "ncclep":
        raise _Ignore("the NCCL-EP flex backend is not priced")
    return "with moe_token_dispatcher_type=flex"


def _enable_deepep(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if not _bool(v, given):
        raise _Ignore("off")
    if "moe_token_dispatcher_type" not in every:
        out["moe_a2a_backend"] = "deepep"
    return "training.moe_a2a_backend=deepep (the legacy switch for the flex dispatcher with DeepEP)"


def _cuda_graph_impl(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    impl = str(v).lower()
    if impl not in ("none", "local", "transformer_engine", "full_iteration"):
        raise InvalidConfigError(f"recipe {given}={v!r}: valid values are none, local, transformer_engine, "
                                 f"full_iteration")
    scope = [s for s in _list(every.get("cuda_graph_scope")) if s != "full"]
    out["cuda_graph_impl"] = impl
    if impl == "none":
        out["cuda_graph_scope"] = []
    elif impl == "local" and scope == ["full_iteration"]:
        out["cuda_graph_impl"], out["cuda_graph_scope"] = "full_iteration", []
        return "training.cuda_graph_impl=full_iteration (local + scope full_iteration, the pre-0.16 spelling)"
    return f"training.cuda_graph_impl={impl}"


def _cuda_graph_scope(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    impl = str(every.get("cuda_graph_impl", "none")).lower()
    if every.get("enable_cuda_graph") is True:
        impl = "local"
    scope = [s for s in _list(v) if s != "full"]
    if impl in ("none", "full_iteration"):
        raise _Ignore(f"cuda_graph_impl={impl}: the scope captures nothing more")
    if impl == "local" and scope == ["full_iteration"]:
        return "with cuda_graph_impl: one graph per iteration"
    out["cuda_graph_scope"] = scope
    return "training.cuda_graph_scope"


def _enable_cuda_graph(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if not _bool(v, given):
        raise _Ignore("off")
    if str(every.get("cuda_graph_impl", "none")).lower() == "none":
        out["cuda_graph_impl"] = "local"
        out.setdefault("cuda_graph_scope", [s for s in _list(every.get("cuda_graph_scope")) if s != "full"])
    return "training.cuda_graph_impl=local (the legacy switch for Megatron-Core per-layer graphs)"


def _a2a_overlap(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    out["moe_a2a_overlap"] = _bool(v, given)
    # delay_wgrad_compute left unstated follows it (None), as Megatron-Bridge's setter turns both on (recipes.md)
    return "training.moe_a2a_overlap"


def _force_balance(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if _bool(v, given):
        out["moe_imbalance"] = 1.0
        return "training.moe_imbalance=1.0 (routing forced to balance)"
    raise _Ignore("free routing: its imbalance is a property of the data; the projection keeps training.moe_imbalance")


def _enum_name(v: Any) -> str:
    """A choice as the command line names it: ``AttnBackend.unfused`` (an enum as a printed config writes it),
    `` Unfused `` and ``unfused`` are all ``unfused``."""
    return str(v).rsplit(".", 1)[-1].strip().lower()


def _optimizer(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    # Megatron-LM --optimizer: adam | muon | dist_muon (deprecated: muon with the layer-wise distributed optimizer,
    # arguments.py) | sgd | lion | soap | adaptive_muon; a printed config may write OptimizerType.MUON
    name = _enum_name(v)
    if name in ("adam", "adamw"):
        out["optimizer"] = "adam"
        return "training.optimizer=adam"
    if name == "muon":
        out["optimizer"] = "muon"
        return "training.optimizer=muon"
    if name == "dist_muon":
        out["optimizer"] = "muon"
        out["use_distributed_optimizer"] = True
        return "training.optimizer=muon with use_distributed_optimizer (Megatron-LM's layer-wise distributed Muon)"
    raise _Ignore(f"the {name} optimizer is not priced (adam and muon are); the step is priced as the training "
                  "section's optimizer")


def _dist_optimizer(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if "optimizer" in every and _enum_name(every["optimizer"]) == "dist_muon" and not _bool(v, given):
        raise _Ignore("optimizer=dist_muon shards Muon's state layer by layer whatever this DDP flag says "
                      "(priced as training.use_distributed_optimizer=true)")
    out["use_distributed_optimizer"] = _bool(v, given)
    return ""


def _attention_backend(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    # AttnBackend.unfused (a printed config), unfused (the command line), None (Megatron-Bridge's unset: auto)
    name = "auto" if v is None else _enum_name(v)
    if name not in ATTENTION_BACKENDS:
        raise InvalidConfigError(f"recipe {given}={v!r}: valid attention backends are {', '.join(ATTENTION_BACKENDS)}")
    out["attention_backend"] = name
    return "training.attention_backend"


def _fused_mlp(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if not _bool(v, given):
        out.setdefault("fused_grouped_mlp", False)
        return "unfused grouped experts (the op graph's default)"
    cutedsl = _bool(every.get("cutedsl_fused_grouped_mlp", False), "cutedsl_fused_grouped_mlp") or \
        str(every.get("env.NVTE_CUTEDSL_FUSED_GROUPED_MLP", "0")) == "1"
    if canonical(given) == "use_transformer_engine_op_fuser":
        if not cutedsl:
            raise _Ignore("the TE op fuser without the CuTe DSL grouped MLP runs the same grouped GEMMs and "
                          "activation kernels: priced as unfused")
        out["fused_grouped_mlp"] = True
        return "training.fused_grouped_mlp (with the CuTe DSL grouped MLP)"
    if not _bool(every.get("use_transformer_engine_op_fuser", False), "use_transformer_engine_op_fuser"):
        raise _Ignore("the CuTe DSL grouped MLP runs inside Transformer Engine's op fuser, which the recipe leaves off")
    return "with use_transformer_engine_op_fuser: training.fused_grouped_mlp"


def _env(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    name = given.split(".", 1)[1] if "." in given else given
    if name == "NVTE_CUTEDSL_FUSED_GROUPED_MLP":
        if str(v) == "1" and _bool(every.get("use_transformer_engine_op_fuser", False), "use_transformer_engine_op_fuser"):
            return "with use_transformer_engine_op_fuser: training.fused_grouped_mlp"
        raise _Ignore("the CuTe DSL grouped MLP runs inside Transformer Engine's op fuser, which the recipe leaves off")
    if name in ("NVLINK_DOMAIN_SIZE", "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "USE_MNNVL"):
        raise _Ignore("HybridEP's view of the NVLink domain: the hardware profile's scale-up domain prices it")
    raise _Ignore("a launcher environment variable: not a priced setting")


def _sharding(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    s = str(v).lower()
    if not _bool(every.get("use_megatron_fsdp", False), "use_megatron_fsdp"):
        raise _Ignore("Megatron-FSDP's sharding strategy; the recipe does not run Megatron-FSDP")
    if s == "optim_grads_params":
        out["fsdp"] = True
        return "training.fsdp=true (ZeRO-3: parameters, gradients and optimizer state sharded)"
    if s == "no_shard":
        return "no FSDP sharding (the distributed optimizer decides the optimizer state's)"
    if s == "optim":
        out["use_distributed_optimizer"] = True
        return "training.use_distributed_optimizer=true (ZeRO-1)"
    raise _Ignore(f"sharding strategy {s}: ZeRO-2 (gradients sharded, parameters not) is not priced")


def _megatron_fsdp(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    on = _bool(v, given)
    out["use_megatron_fsdp"] = on
    if on:
        if str(every.get("data_parallel_sharding_strategy", "optim_grads_params")).lower() == "optim_grads_params":
            out["fsdp"] = True
        return "training.use_megatron_fsdp (fsdp=true with ZeRO-3 sharding)"
    return "training.use_megatron_fsdp=false"


def _fsdp_flag(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if not _bool(v, given):
        raise _Ignore("off")
    if not _bool(every.get("use_megatron_fsdp", False), "use_megatron_fsdp"):
        raise _Ignore("a Megatron-FSDP option; the recipe does not run Megatron-FSDP")
    out[canonical(given)] = True
    return f"training.{canonical(given)}"


def _grad_fp32(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if given.startswith("ddp.") and every.get("_bare_grad_reduce_in_fp32"):
        raise _Ignore("overridden by the mixed-precision recipe's grad_reduce_in_fp32, which Megatron-Bridge "
                      "copies onto the DDP config")
    out["grad_reduce_in_fp32"] = _bool(v, given)
    return "training.grad_reduce_in_fp32"


def _mtp(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    out["mtp_num_layers"] = 0 if v is None else _int(v, given)
    return "training.mtp_num_layers"


def _mtp_repeated(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    out["mtp_use_repeated_layer"] = _bool(v, given)
    return "training.mtp_use_repeated_layer"


def _layout_split(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if every.get("pipeline_model_parallel_layout"):
        raise _Ignore("the explicit pipeline_model_parallel_layout places the embedding and loss")
    out[canonical(given)] = _bool(v, given)
    return ""


def _loss_fusion(v: Any, given: str, out: dict[str, Any], every: dict[str, Any]) -> str:
    if canonical(given) == "cross_entropy_fusion_impl":
        if str(v).lower() in ("te", "native"):
            out.setdefault("loss_fusion", True)
            return "training.loss_fusion=true (a fused vocab-parallel cross entropy either way)"
        raise InvalidConfigError(f"recipe {given}={v!r}: valid values are te and native")
    out["loss_fusion"] = _bool(v, given)
    return "training.loss_fusion"


SETTINGS: dict[str, Handler] = {
    # layout and batch
    "tp": _set("tp", _int), "pp": _set("pp", _int), "vpp": _set("vpp", _int), "cp": _set("cp", _int),
    "cp_comm_type": _cp_comm_type,
    "ep": _set("ep", _int), "etp": _set("etp", _int), "mbs": _set("mbs", _int), "gbs": _set("gbs", _int),
    "seq_len": _set("seq_len", _int), "sequence_parallel": _flag("sequence_parallel"),
    "pipeline_model_parallel_layout": _layout,
    "decoder_first_pipeline_num_layers": _set("decoder_first_pipeline_num_layers", _int),
    "decoder_last_pipeline_num_layers": _set("decoder_last_pipeline_num_layers", _int),
    "account_for_embedding_in_pipeline_split": _layout_split, "account_for_loss_in_pipeline_split": _layout_split,
    # precision
    "bf16": _precision_flag("bf16"), "fp16": _precision_flag("bf16"),
    "fp8_format": _fp8_format, "fp8": _fp8_format, "fp8_recipe": _fp8_recipe, "fp4_recipe": _fp4_recipe,
    "fp4": _fp4_format, "fp4_format": _fp4_format,
    "fp8_param_gather": _param_gather, "fp4_param_gather": _param_gather,
    "fp8_dot_product_attention": _flag("fp8_dot_product_attention"), "fp8_output_proj": _flag("fp8_output_proj"),
    "activation_func_fp8_input_store": _flag("fp8_activations"),
    "first_last_layers_bf16": _flag("first_last_layers_bf16"),
    "num_layers_at_start_in_bf16": _set("num_layers_at_start_in_bf16", _int),
    "num_layers_at_end_in_bf16": _set("num_layers_at_end_in_bf16", _int),
    "reuse_grad_buf_for_mxfp8_param_ag": _ignore("the MXFP8 parameter all-gather's staging buffer borrows the "
                                                 "gradient buffer; this memory accounting holds no separate one"),
    "moe_router_padding_for_fp8": _ignore("pads the routing map to FP8 GEMM alignment (< 32 rows per expert); "
                                          "the expert GEMMs are priced on whole tiles either way"),
    "moe_router_padding_for_quantization": _ignore("pads the routing map to FP8 GEMM alignment (< 32 rows per "
                                                   "expert); the expert GEMMs are priced on whole tiles either way"),
    "use_precision_aware_optimizer": _ignore("with Megatron's default state dtypes (fp32 master, m, v) the fused "
                                             "optimizer keeps the same bytes"),
    # recompute
    "recompute_granularity": _recompute_granularity, "recompute_modules": _recompute_modules,
    "recompute_method": _recompute_method, "recompute_num_layers": _set("recompute_num_layers", _int),
    "recompute_activations": _recompute_activations,
    # MoE dispatch
    "moe_token_dispatcher_type": _dispatcher_type, "moe_flex_dispatcher_backend": _flex_backend,
    "moe_enable_deepep": _enable_deepep, "moe_flex_dispatcher_num_sms": _flex_only(
        "moe_flex_dispatcher_num_sms", _int, "the SMs of the flex dispatcher's kernels"),
    "moe_hybridep_num_sms_preprocessing": _ignore("SMs of HybridEP's metadata preprocessing, which runs before the "
                                                  "dispatch, not beside compute"),
    "moe_a2a_overlap": _a2a_overlap, "delay_wgrad_compute": _flag("delay_wgrad_compute"),
    "moe_shared_expert_overlap": _flag("moe_shared_expert_overlap"),
    "moe_router_fusion": _flag("moe_router_fusion"),
    "moe_permute_fusion": _same(True, "the op graph's fused permute/unpermute",
                                "unfused permutation is not priced (every published recipe fuses it)"),
    "moe_grouped_gemm": _same(True, "the op graph's grouped expert GEMMs",
                              "sequential per-expert MLPs are not priced (every published recipe groups them)"),
    "moe_expert_capacity_factor": _set("moe_expert_capacity_factor", lambda v, k: None if v is None else _float(v, k)),
    "moe_pad_expert_input_to_capacity": _flag("moe_pad_expert_input_to_capacity"),
    "moe_router_force_load_balancing": _force_balance,
    "moe_expert_rank_capacity_factor": _flex_only("moe_expert_rank_capacity_factor",
                                                  lambda v, k: None if v is None else _float(v, k),
                                                  "the flex dispatcher's static per-rank token budget"),
    "moe_paged_stash": _flex_only("moe_paged_stash", _bool, "the paged stash of the static budget's buffers"),
    "moe_paged_stash_buffer_factor": _flex_only("moe_paged_stash_buffer_factor", _float,
                                                "the paged stash's buffer size"),
    "moe_paged_stash_buffer_size_factor_cpu": _ignore("the paged stash's host overflow buffer: host memory, not HBM"),
    "moe_mlp_glu_interleave_size": _ignore("the fused grouped MLP's weight layout: no cost"),
    "moe_pad_experts_for_cuda_graph_inference": _ignore("an inference-only switch"),
    "high_priority_a2a_comm_stream": _ignore("stream priority: the overlap model already starts each all-to-all as "
                                             "soon as its input is ready"),
    "use_transformer_engine_op_fuser": _fused_mlp, "cutedsl_fused_grouped_mlp": _fused_mlp,
    "mtp_num_layers": _mtp, "mtp_use_repeated_layer": _mtp_repeated,
    # CUDA graphs
    "cuda_graph_impl": _cuda_graph_impl, "cuda_graph_scope": _cuda_graph_scope,
    "enable_cuda_graph": _enable_cuda_graph,
    # overlap and data parallel
    "tp_comm_overlap": _flag("tp_comm_overlap"), "overlap_grad_reduce": _flag("overlap_grad_reduce"),
    "overlap_param_gather": _flag("overlap_param_gather"),
    "overlap_param_gather_with_optimizer_step": _ignore("starts the parameter all-gather in the optimizer step "
                                                        "(interleaved pipelines); priced as overlap_param_gather"),
    "align_param_gather": _ignore("aligns the interleaved chunks' all-gathers; priced as overlap_param_gather"),
    "defer_embedding_wgrad": _ignore("moves the embedding's weight gradient into the pipeline flush (one scatter-add "
                                     "per step: under 0.1% of a step, not priced)"),
    "wgrad_deferral_limit": _ignore("how many micro-batches defer_embedding_wgrad may hold: not priced"),
    "use_distributed_optimizer": _dist_optimizer,
    "data_parallel_sharding_strategy": _sharding, "use_megatron_fsdp": _megatron_fsdp,
    "fsdp_double_buffer": _fsdp_flag,
    "nccl_ub": _ignore("NCCL user buffers (zero-copy, fewer SMs per collective); the comm model prices bandwidth "
                       "and latency, not the SMs NCCL holds"),
    "keep_fp8_transpose_cache": _ignore("Megatron-FSDP's FP8 transpose cache across steps (false: rebuilt each "
                                        "step, as the FP8 weight copies are priced)"),
    "average_in_collective": _ignore("scales gradients inside the reduction instead of before it: the same traffic"),
    "grad_reduce_in_fp32": _grad_fp32, "gradient_accumulation_fusion": _flag("gradient_accumulation_fusion"),
    "cpu_offloading": _flag("cpu_offloading"),
    "cpu_offloading_num_layers": _offload_detail("cpu_offloading_num_layers", _int),
    "cpu_offloading_weights": _offload_detail("cpu_offloading_weights", _bool),
    "fine_grained_activation_offloading": _fine_grained_offload, "offload_modules": _offload_modules,
    "fine_grained_offloading_max_inflight_offloads": _ignore(
        "how many offloads of one module may wait unjoined on the main stream (a CUDA-graph aid): the copies are "
        "priced as running beside compute either way"),
    "delay_offload_until_cuda_graph": _ignore("moves the offload launches after the graph replay: the same copies"),
    "min_offloaded_tensor_size": _ignore("priced at Megatron-Core's default (2^20 elements: smaller saved tensors "
                                         "stay on the GPU)"),
    "delta_offload_bytes_across_pp_ranks": _ignore("a per-rank offload budget tweak: every listed module is priced "
                                                   "as offloaded on every rank"),
    "cpu_offloading_activations": _same(True, "offloaded layers' activations (Megatron-Core's default)",
                                        "weights-only offloading is not priced"),
    # kernels and host
    "attention_backend": _attention_backend,
    "apply_rope_fusion": _same(True, "the op graph's fused RoPE", "unfused RoPE is not priced"),
    "cross_entropy_fusion_impl": _loss_fusion, "loss_fusion": _loss_fusion,
    "manual_gc": _ignore("Python garbage collection every manual_gc_interval steps instead of at random: not in a "
                         "priced steady-state step"),
    "manual_gc_interval": _ignore("see manual_gc"),
    "init_model_with_meta_device": _ignore("initialisation only"),
    "optimizer": _optimizer,
    "muon_num_ns_steps": _set("muon_ns_steps", _int),
    "muon_split_qkv": _same(True, "the fused QKV weight orthogonalised as its Q, K and V blocks",
                            "orthogonalising the fused QKV weight whole is not priced"),
    "muon_no_split_qkv": _same(False, "the fused QKV weight orthogonalised as its Q, K and V blocks",
                               "orthogonalising the fused QKV weight whole is not priced"),
    "muon_tp_mode": _same("blockwise", "each tensor-parallel shard orthogonalised on its own",
                          "Newton-Schulz on gathered or distributed tensor-parallel matrices is not priced"),
    "muon_coefficient_type": _same("quintic", "the quintic Newton-Schulz iteration",
                                   "other Newton-Schulz coefficient sets (simple, polar_express, ...) are not priced"),
    "muon_scalar_optimizer": _same("adam", "embeddings, norms and biases on AdamW",
                                   "Lion for the scalar parameters is not priced"),
    "muon_momentum": _ignore("a coefficient: no cost"), "muon_nesterov": _ignore("a coefficient: no cost"),
    "muon_scale_mode": _ignore("the update's scale: no cost"),
    "muon_extra_scale_factor": _ignore("the update's scale: no cost"),
    "qk_clip": _ignore("QK-Clip (MuonClip) rescales the query/key weights once per step from the max attention logit "
                       "each fused-attention forward reduces: a few small kernels and one host check per layer per "
                       "step, under 0.1% of a step, not priced"),
    "qk_clip_alpha": _ignore("see qk_clip"), "qk_clip_threshold": _ignore("see qk_clip"),
    "log_max_attention_logit": _ignore("a logged statistic (see qk_clip): not priced"),
    "muon_fp32_matmul_prec": _ignore("the Newton-Schulz GEMMs are priced at the BF16 rate whatever it says"),
    # model and framework settings a Megatron-Bridge recipe carries that cost nothing or that the card decides
    # (benchmarks/bridge_recipes.py lists what the performance recipes set)
    "transformer_impl": _same("transformer_engine", "Transformer Engine layers (the op graph's kernels)",
                              "Megatron-Core's local (non-TE) layers are not priced: the TE kernels are"),
    "cuda_graph_warmup_steps": _ignore("eager steps before the CUDA-graph capture: not in a steady-state step"),
    "use_te_rng_tracker": _ignore("the RNG state tracker CUDA graphs need: no cost"),
    "pipeline_dtype": _ignore("the dtype of the activations pipeline stages pass: the P2P edges are priced in BF16"),
    "init_method_std": _ignore("initialisation only"),
    "should_pad_vocab": _ignore("the vocabulary padding: the card's vocabulary padded to 128 x tp is priced"),
    "make_vocab_size_divisible_by": _ignore("the vocabulary padding: the card's vocabulary padded to 128 x tp is "
                                            "priced"),
    "vocab_size": _card_field("vocab_size"),
    "position_embedding_type": _ignore("the card's position embedding is priced (rope, learned or none)"),
    "rotary_base": _ignore("a RoPE constant: no cost"), "rotary_scaling_factor": _ignore("a RoPE constant: no cost"),
    "yarn_original_max_position_embeddings": _ignore("a RoPE (YaRN) constant: no cost"),
    "bias_activation_fusion": _ignore("bias add and activation in one kernel where the MLP has a bias: the op graph "
                                      "prices the activation as one fused pass"),
    "fused_single_qkv_rope": _ignore("RoPE applied in the QKV projection's epilogue: the op graph prices one fused "
                                     "RoPE pass either way"),
    "mla_down_proj_fusion": _ignore("MLA's q and kv down projections as one GEMM: priced as two GEMMs of the same "
                                    "FLOPs (a launch and a wave tail apart)"),
    "mtp_loss_scaling_factor": _ignore("a loss coefficient: no cost"),
    "moe_aux_loss_coeff": _ignore("a loss coefficient: the aux-loss statistics are priced with the router"),
    "calculate_per_token_loss": _ignore("the loss normalised per token instead of per micro-batch: one scalar "
                                        "reduction, not priced"),
    "moe_router_dtype": _ignore("the router's logits and probabilities are priced in fp32 (Megatron-Core's fp32 "
                                "router); a bf16 router halves one T x E buffer, not priced"),
    "tp_only_amax_red": _ignore("FP8 amaxes reduced over TP only instead of every rank: a small all-reduce per "
                                "step, not priced"),
    "overlap_dispatch_backward_with_experts_wgrad": _same(
        False, "off", "the dispatch backward overlapped with the experts' weight gradients is not priced apart from "
                      "delay_wgrad_compute"),
    "moe_ncclep_zero_copy": _ignore("a setting of the NCCL-EP flex backend, which is not priced"),
    "moe_paged_stash_page_size": _ignore("the paged stash's page size: the stash is priced by its bytes"),
    "batch_p2p_comm": _ignore("how the pipeline's sends and receives are issued: the P2P edges are priced by their "
                              "bytes either way"),
    "overlap_p2p_comm": _ignore("how the pipeline's sends and receives are issued: the P2P edges are priced by their "
                                "bytes either way"),
    "external_cuda_graph": _ignore("a graph captured outside Megatron-Core: the capture is priced as "
                                   "cuda_graph_impl says"),
}
"""Canonical setting name -> how it is read (see the module docstring)."""


def _is_env(key: str) -> bool:
    return key.startswith("env.")


def _is_note(key: str) -> bool:
    return key.startswith("(")


# ------------------------------------------------------------------------------------------------ reading
def split_recipe(text: str) -> list[tuple[str, Any]]:
    """``key=value;key=value`` -> [(key, parsed value)] in order. A value holding ``=`` keeps it after the first
    one; an item without ``=`` is a bare flag (True); parenthesised notes pass through as keys starting with '('."""
    out: list[tuple[str, Any]] = []
    for item in _split_top(text, ";"):
        item = item.strip()
        if not item:
            continue
        if item.startswith("("):
            out.append((item, True))
            continue
        key, eq, val = item.partition("=")
        if eq and "=" in val and re.fullmatch(r"[A-Za-z_][\w.]*", val.split("=", 1)[0]) and canonical(
                val.split("=", 1)[0]) in SETTINGS:  # 'fp8_param_gather=fp4_param_gather=True': the second names it
            key, _, val = val.partition("=")
        out.append((key.strip(), parse_value(val) if eq else True))
    return out


def _split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside brackets and parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _shell_comments_out(text: str) -> str:
    """``text`` without its shell comments: a ``#`` that starts a word (at a line's start or after white space,
    outside quotes) to the end of its line. A ``#`` inside a word stays, as in the shell (shlex's own comment
    handling cuts ``run#1`` at the ``#``)."""
    out: list[str] = []
    quote = ""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\" and quote == '"' and i + 1 < n:
                out.append(text[i:i + 2])
                i += 2
                continue
            quote = "" if c == quote else quote
        elif c == "\\" and i + 1 < n:
            out.append(text[i:i + 2])
            i += 2
            continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1].isspace()):
            while i < n and text[i] != "\n":
                i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def split_megatron_args(text: str) -> list[tuple[str, Any]]:
    """A Megatron-LM command line -> [(flag, value)]: ``--flag value``, ``--flag=value``, bare ``--flag`` (True),
    ``--flag a b`` (a list); ``NAME=value`` words before the command become ``env.NAME``; anything else before the
    first flag (the launcher, the script) is skipped. As the shell reads it: a backslash-newline continues the line
    and a ``#`` that starts a word starts a comment (:func:`_shell_comments_out`), so a multi-line launch script (or
    ``export --to megatron``'s output) pastes whole."""
    try:
        words = shlex.split(_shell_comments_out(text.replace("\\\r\n", " ").replace("\\\n", " ")))
    except ValueError as exc:
        raise InvalidConfigError(f"--megatron-args could not be split into words: {exc}") from None
    out: list[tuple[str, Any]] = []
    i = 0
    while i < len(words) and not words[i].startswith("--"):
        env = re.fullmatch(r"([A-Z_][A-Z0-9_]*)=(.*)", words[i])
        if env:  # NAME=value before the command: the launch environment
            out.append((f"env.{env.group(1)}", parse_value(env.group(2))))
        i += 1
    while i < len(words):
        w = words[i]
        if not w.startswith("--"):
            raise InvalidConfigError(f"--megatron-args: {w!r} follows no flag")
        name, eq, val = w.partition("=")
        if eq:
            out.append((name, parse_value(val)))
            i += 1
            continue
        vals = []
        i += 1
        while i < len(words) and not words[i].startswith("--"):
            vals.append(parse_value(words[i]))
            i += 1
        out.append((name, True if not vals else vals[0] if len(vals) == 1 else vals))
    return out


def read_recipe(items: list[tuple[str, Any]] | Mapping[str, Any] | str, *, lenient: bool = False) -> RecipeReading:
    """Read a recipe (pairs, a mapping or a ``key=value;...`` string) onto TrainingConfig keys. A value a setting
    cannot take is an InvalidConfigError naming it; ``lenient`` (a published row's cell, which nobody here can
    correct) lists that setting as ignored with the same message instead and reads the others."""
    if isinstance(items, str):
        items = split_recipe(items)
    elif isinstance(items, Mapping):
        items = [(str(k), parse_value(v) if isinstance(v, str) else v) for k, v in items.items()]
    every: dict[str, Any] = {}
    for key, val in items:
        if _is_env(key):
            every[key] = val
        elif not _is_note(key):
            c = canonical(key)
            if c.startswith("no_") and c[3:] in SETTINGS and val is True:
                c, val = c[3:], False
            if c in _BARE_OUTRANKS_DDP and not key.startswith("ddp."):
                every[f"_bare_{c}"] = True
            if not (key.startswith("ddp.") and c in every):  # a bare field outranks the ddp.* copy
                every[c] = val
    out: dict[str, Any] = {}
    entries: list[RecipeEntry] = []
    for key, val in items:
        if _is_note(key):
            entries.append(RecipeEntry(key, "", IGNORED, "a note in the recipe cell, not a setting"))
            continue
        handler = _env if _is_env(key) else SETTINGS.get(canonical(key))
        negated = canonical(key)[3:] if canonical(key).startswith("no_") else ""
        if handler is None and negated in SETTINGS and val is True:  # Megatron-LM's --no-X store_false flags
            handler, val = SETTINGS[negated], False
        if handler is None:
            entries.append(RecipeEntry(key, val, IGNORED, UNKNOWN_WHY))
            continue
        before = dict(out) if lenient else out
        try:
            why = handler(val, key, out, every)
            entries.append(RecipeEntry(key, val, PRICED, why))
        except _Ignore as exc:
            entries.append(RecipeEntry(key, val, IGNORED, str(exc)))
        except InvalidConfigError as exc:
            if not lenient:
                raise
            out.clear()
            out.update(before)  # nothing of the unreadable setting is kept
            entries.append(RecipeEntry(key, val, IGNORED, f"a value this projection cannot read: {exc}"))
    model = out.pop(_MODEL, {})
    return RecipeReading(training=out, entries=tuple(entries), model=model)


def unknown_settings(reading: RecipeReading) -> list[str]:
    """Keys of a reading that no setting of this table knows (the user's typos, or newer framework fields)."""
    return [e.key for e in reading.ignored if e.why == UNKNOWN_WHY]


# ------------------------------------------------------------------------------------------------ writing
def megatron_args(training: Any) -> list[tuple[str, Any]]:
    """The recipe settings of a TrainingConfig as Megatron-LM arguments, by the name argparse stores them under
    (``moe_token_dispatcher_type``; True = a bare flag, False = its ``--no-`` form), and launch environment variables
    (``env.NAME``, value): the inverse of ``read_recipe`` for the settings this module reads beyond the layout,
    batch, precision and the keys ``raytune_primus.export`` writes itself (RECIPE_TRAINING_KEYS lists these)."""
    t = training
    out: list[tuple[str, Any]] = []

    def flag(name: str, on: bool) -> None:
        if on:
            out.append((name, True))

    if t.moe_a2a_backend in ("deepep", "hybridep"):
        out += [("moe_token_dispatcher_type", "flex"), ("moe_flex_dispatcher_backend", t.moe_a2a_backend)]
    if t.moe_flex_dispatcher_num_sms is not None:
        out.append(("moe_flex_dispatcher_num_sms", t.moe_flex_dispatcher_num_sms))
    if t.moe_expert_rank_capacity_factor is not None:
        out.append(("moe_expert_rank_capacity_factor", t.moe_expert_rank_capacity_factor))
    flag("moe_paged_stash", t.moe_paged_stash)
    if t.moe_paged_stash and t.moe_paged_stash_buffer_factor != 1.10:
        out.append(("moe_paged_stash_buffer_size_factor_cuda", t.moe_paged_stash_buffer_factor))
    flag("overlap_moe_expert_parallel_comm", t.moe_a2a_overlap)
    flag("delay_wgrad_compute", t.delays_wgrad)
    flag("moe_shared_expert_overlap", t.moe_shared_expert_overlap)
    flag("moe_router_fusion", t.moe_router_fusion)
    if t.fused_grouped_mlp:  # Megatron-Core takes the CuTe DSL kernel from the environment (TEGroupedMLP)
        out += [("env.NVTE_CUTEDSL_FUSED_GROUPED_MLP", 1), ("use_transformer_engine_op_fuser", True)]
    flag("fp8_dot_product_attention", t.fp8_dot_product_attention)
    if t.attention_backend != "auto":
        out.append(("attention_backend", t.attention_backend))
    flag("fp8_output_proj", t.fp8_output_proj)
    flag("activation_func_fp8_input_store", t.fp8_activations)
    if t.first_last_layers_bf16:
        out += [("first_last_layers_bf16", True), ("num_layers_at_start_in_bf16", t.num_layers_at_start_in_bf16),
                ("num_layers_at_end_in_bf16", t.num_layers_at_end_in_bf16)]
    if not t.gradient_accumulation_fusion:
        out.append(("gradient_accumulation_fusion", False))
    if t.cpu_offloading:
        out += [("cpu_offloading", True), ("cpu_offloading_num_layers", t.cpu_offloading_num_layers)]
        flag("cpu_offloading_weights", t.cpu_offloading_weights)
    flag("fsdp_double_buffer", t.fsdp_double_buffer)
    if t.optimizer != "adam":
        out.append(("optimizer", t.optimizer))
        if t.muon_ns_steps != 5:
            out.append(("muon_num_ns_steps", t.muon_ns_steps))
    if t.cp_comm_type != "p2p":
        out.append(("cp_comm_type", [t.cp_comm_type]))
    if t.offload_modules:  # Megatron-LM validate_args: TE >= 2.10 needs NVTE_CPU_OFFLOAD_V1=1 for it
        out += [("fine_grained_activation_offloading", True), ("offload_modules", list(t.offload_modules)),
                ("env.NVTE_CPU_OFFLOAD_V1", 1)]
    if t.mtp_num_layers is not None:
        out.append(("mtp_num_layers", t.mtp_num_layers))
    if t.mtp_use_repeated_layer:
        out.append(("mtp_use_repeated_layer", True))
    return out


CONFIG_ONLY: dict[str, str] = {
    "fp8_dot_product_attention": "a TransformerConfig field with no Megatron-LM flag (Megatron-Bridge recipes set it)",
    "activation_func_fp8_input_store": "a TransformerConfig field with no Megatron-LM flag (Megatron-Bridge recipes "
                                       "set it)",
    "cpu_offloading_weights": "a TransformerConfig field with no Megatron-LM flag (Megatron-Bridge recipes set it)",
    "cpu_offloading": "implied by --cpu-offloading-num-layers > 0",
}
"""Settings ``megatron_args`` names that Megatron-LM's command line cannot take (checked against its argument
parser: tests/frameworks), and why: the export lists them instead of writing a flag argparse would refuse."""


def megatron_cli_args(training: Any) -> tuple[list[tuple[str, Any]], list[tuple[str, Any, str]]]:
    """``megatron_args`` split into what Megatron-LM's command line takes (and the environment) and the settings it
    cannot take, each with why (CONFIG_ONLY; ``cpu_offloading`` is implied by its layer count, not listed)."""
    cli, rest = [], []
    for name, value in megatron_args(training):
        if name == "cpu_offloading":
            continue
        if name in CONFIG_ONLY:
            rest.append((name, value, CONFIG_ONLY[name]))
        else:
            cli.append((name, value))
    return cli, rest


RECIPE_TRAINING_KEYS: tuple[str, ...] = (
    "moe_a2a_backend", "moe_a2a_overlap", "fp8_activations", "moe_flex_dispatcher_num_sms", "moe_expert_rank_capacity_factor", "moe_paged_stash",
    "moe_paged_stash_buffer_factor", "moe_shared_expert_overlap", "delay_wgrad_compute", "moe_router_fusion",
    "fused_grouped_mlp", "fp8_dot_product_attention", "attention_backend", "fp8_output_proj", "first_last_layers_bf16",
    "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "gradient_accumulation_fusion", "cpu_offloading",
    "cpu_offloading_num_layers", "cpu_offloading_weights", "fsdp_double_buffer", "optimizer",
    "mtp_num_layers", "mtp_use_repeated_layer", "muon_ns_steps", "cp_comm_type", "offload_modules")
"""Training keys ``megatron_args`` writes (export marks them done)."""
