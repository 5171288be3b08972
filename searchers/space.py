"""The configuration space: which training values a search may try, and which of them are legal.

Built from a baseline :class:`~oracle.config.RunConfig` (model card + cluster + training section).
Every ``TrainingConfig`` field is an axis; most hold the baseline value, the searched ones get a
default value list derived from the card and cluster:

====================  ==============================================================================
axis                  default values
====================  ==============================================================================
tp                    powers of two up to GPUs per node
cp                    1, 2, 4, 8
pp                    divisors of the GPU count up to the number of layers
vpp                   1, 2, 3, 4
pp_schedule           the registered schedules marked searched_by_default: 1f1b, interleaved,
                      zero_bubble, ilp, zbv (paper Sec. 2); never 'auto'
ep                    divisors of the expert count up to the GPU count (MoE only)
mbs                   1, 2, 4, 8
recompute             none, selective, full
precision             the baseline's: numerics are the user's (NUMERICS); ``allow=("precision",)`` opens
                      bf16, fp8, nvfp4 (each only where the hardware has it) and the FP8 recipes
moe_a2a_backend       alltoall, deepep (MoE only)
moe_sync_free         false, true (MoE on AMD parts only: Primus-Turbo; true needs deepep)
use_distributed_optimizer / fsdp     true/false each
software settings     the baseline's; ``allow=("software",)`` opens them (SOFTWARE, software_defaults): the
                      dispatcher with hybridep (NVIDIA), the all-to-all and shared-expert overlaps, the fused
                      router and grouped MLP, CUDA graphs, FP8 weight gathers, each where the part runs it
everything else       the baseline value (gbs, etp, recompute_num_layers, overlap flags, ...)
pipeline layout keys  derived per (pp, vpp), not searched (LAYOUT_KEYS): uneven where pp does not divide
                      the layers
====================  ==============================================================================

The baseline's own values are always included. A user ``pin`` sets an axis to one value; a user
``restrict`` replaces an axis's value list (any TrainingConfig field may be restricted, e.g.
``recompute_num_layers: [null, 1, 2]`` or ``overlap_grad_reduce: [true, false]``).

Axes that change what is trained rather than how (:data:`NUMERICS`: number format and FP8 recipe, FP8
activations, token dropping) hold the baseline's value unless the space opens them: a ``restrict`` that
lists them, or ``allow`` naming their group, which gives the group its default values
(:func:`numerics_defaults`). :meth:`SearchSpace.numerics` says which were open and what a point changed.

Legality is the oracle's (:func:`oracle.legality.check`), never re-implemented here. Three
canonical-form rules remove duplicates that the oracle would treat alike: with ``ep == 1`` the MoE
dispatcher is 'alltoall' (no all-to-all to replace), a sync-free MoE needs DeepEP (so
``moe_sync_free`` is false with 'alltoall'), and ``fsdp`` implies ``use_distributed_optimizer =
false`` (ZeRO-3 subsumes ZeRO-1).

Enumeration checks the structural axes (layout, schedule, batch, recompute) with the baseline
flags, the flag axes (precision, dispatcher, sharding, overlap) with the baseline structure, and
then every combination of the two survivors with the full legality check, so every enumerated
point is legal; a rule that lets a flag rescue an otherwise illegal structure would be missed
(none exists today). A flag combination illegal with the baseline's structure is tried on the other
structures unless one of the oracle's rule groups (``oracle.legality.RULES``) refuses it having read no
structure field: then none can make it legal (the software group's CUDA-graph scopes without a graph, FP8
weight gathers in BF16), and the scan is skipped (Qwen3-30B-A3B on 8 B200 with the software group: ~425k
points in ~12 s instead of ~60 s; the same points either way). Each check's verdict is memoised on the fields
it read (``_ReadMemo``), so the combinations that differ only in fields legality did not look at are
answered without it: Mixtral 8x22B on 32 GPUs (117,432 points) enumerates in ~4 s of CPU, ~3x faster than
checking every combination.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import operator
import typing
from collections.abc import Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any

from oracle.config import RunConfig, TrainingConfig
from oracle.errors import InvalidConfigError
from oracle.legality import RULES as LEGALITY_RULES
from oracle.legality import check as legality_check
from oracle.pipeline.schedules import SCHEDULES
from oracle.pipeline_layout import card_weights, uneven_options
from oracle.schema import coerce, unknown_key_problems

FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainingConfig))
_HINTS = typing.get_type_hints(TrainingConfig, include_extras=True)

LAYOUT_KEYS: tuple[str, ...] = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                                "pipeline_model_parallel_layout", "account_for_embedding_in_pipeline_split",
                                "account_for_loss_in_pipeline_split")
"""Megatron's pipeline layout keys (oracle.pipeline_layout). Unless pinned or restricted they are derived
per (pp, vpp), not searched: the baseline's own keys at the baseline's (pp, vpp), the best balanced
uneven layout (``uneven_options``) where the layers do not split evenly over the pp ranks, else none,
so a pp that does not divide the layers (DeepSeek-V3's 61 at pp=16, Llama 3.1 405B's 126 at pp=16 with
vpp=8) stays reachable."""
_PREFERRED_ORDER: tuple[str, ...] = (
    "tp", "cp", "pp", "vpp", "pp_schedule", "ep", "etp", "mbs", "gbs", "seq_len",
    "recompute", "recompute_num_layers", "precision", "fp8_activations", "moe_a2a_backend", "moe_sync_free",
    "moe_a2a_overlap",
    "use_distributed_optimizer", "fsdp", "overlap_grad_reduce", "overlap_param_gather",
    "sequence_parallel", "loss_fusion", "moe_imbalance", "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers", "pipeline_model_parallel_layout", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split")
CANONICAL_ORDER: tuple[str, ...] = tuple(f for f in _PREFERRED_ORDER if f in FIELDS) + tuple(
    sorted(f for f in FIELDS if f not in _PREFERRED_ORDER))
"""Every TrainingConfig field, in the order axes are listed (fields added later go last)."""

STRUCTURE_AXES = frozenset({"tp", "cp", "pp", "vpp", "pp_schedule", "ep", "etp", "mbs", "gbs", "seq_len",
                            "recompute", "recompute_num_layers", *LAYOUT_KEYS})
"""Axes enumerated as the 'structure' block; the rest form the 'flags' block (see module doc)."""
ORDINAL_AXES = frozenset({"tp", "cp", "pp", "vpp", "ep", "etp", "mbs", "gbs", "seq_len",
                          "recompute_num_layers", "moe_imbalance"})
"""Numeric axes whose neighbours are the adjacent values (others are categorical)."""
_LAYOUT_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(TrainingConfig)
                                    if f.name in LAYOUT_KEYS}
PARALLEL_AXES: tuple[str, ...] = ("tp", "cp", "pp", "vpp", "ep", "etp")
NUMERICS: dict[str, tuple[str, ...]] = {
    "precision": ("precision", "fp8_recipe", "fp8_dot_product_attention", "fp8_output_proj", "first_last_layers_bf16",
                  "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"),
    "fp8_activations": ("fp8_activations",),
    "token_drop": ("moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity", "moe_expert_rank_capacity_factor"),
    "optimizer": ("optimizer", "muon_ns_steps"),
    "mtp": ("mtp_num_layers",),
}
"""Groups of axes that change the numerics (what is trained, not how): held at the baseline's value unless
the space restricts them to a list or ``allow`` names their group."""
NUMERICS_AXES: tuple[str, ...] = tuple(a for axes in NUMERICS.values() for a in axes)
SOFTWARE: tuple[str, ...] = ("moe_a2a_backend", "moe_a2a_overlap", "moe_shared_expert_overlap", "moe_router_fusion",
                             "fused_grouped_mlp", "cuda_graph_impl", "cuda_graph_scope", "fp8_param_gather")
"""The ``software`` group of ``allow``: settings that change how a step runs, not what it trains (the MoE dispatcher and
its overlaps, fused kernels, CUDA graphs, FP8 weight gathers), held at the baseline's value (the framework's default
unless the user set them) unless the space opens the group or restricts them (:func:`software_defaults`)."""
ALLOW_GROUPS: tuple[str, ...] = (*NUMERICS, "software")
"""What ``allow`` may name: a numerics group or ``software``."""


def numerics_defaults(run: RunConfig, group: str) -> dict[str, list[Any]]:
    """The values an opened numerics group searches on ``run``'s hardware and model (legality prunes the
    combinations, e.g. an FP8 recipe other than delayed without precision fp8)."""
    hw, m = run.cluster.hardware, run.model
    fp8 = hw.supports("fp8")
    if group == "precision":
        return {"precision": ["bf16"] + (["fp8"] if fp8 else []) + (["nvfp4"] if hw.fp4_gemms else []),
                "fp8_recipe": (["delayed", "tensorwise", "blockwise"] + (["mxfp8"] if hw.mxfp8_gemms else []))
                if fp8 else ["delayed"]}
    if group == "fp8_activations":
        return {"fp8_activations": [False, True] if fp8 else [False]}
    if group == "token_drop":
        return ({"moe_expert_capacity_factor": [None, 1.0], "moe_pad_expert_input_to_capacity": [False, True]}
                if m.is_moe else {})
    if group == "optimizer":
        return {"optimizer": ["adam", "muon"]}
    if group == "mtp":
        return {"mtp_num_layers": sorted({0, m.mtp_layers})} if m.mtp_layers else {}
    if group == "software":
        return software_defaults(run)
    raise InvalidConfigError(f"allow: unknown group {group!r}; valid: {', '.join(ALLOW_GROUPS)}")


def software_defaults(run: RunConfig) -> dict[str, list[Any]]:
    """The values the ``software`` group searches on ``run``'s hardware, model and framework (legality prunes the
    combinations a framework refuses, e.g. the all-to-all overlap at ep 1 or CUDA graphs around a dropless MoE block):

    * MoE: the dispatcher (alltoall, deepep, and hybridep on NVIDIA parts), the EP all-to-all overlap, the shared
      experts' overlap (models with shared experts), the fused router and, on Blackwell (compute capability 10.x, where
      Transformer Engine has the CuTe DSL kernel), the fused grouped MLP: Megatron-Core / Transformer Engine settings;
    * NVIDIA parts under Megatron-Core: CUDA graphs, none, per layer (transformer_engine: the whole layer, and for MoE
      models the scope NVIDIA's MoE recipes capture, attention + router + preprocessing) or the whole iteration;
    * FP8 parts: FP8 weight gathers (``fp8_param_gather``; only with an FP8/FP4 format and the distributed optimizer).
    """
    hw, m, t = run.cluster.hardware, run.model, run.training
    nvidia, megatron = hw.vendor.lower() == "nvidia", t.framework == "megatron"
    d: dict[str, list[Any]] = {}
    if m.is_moe:
        d["moe_a2a_backend"] = ["alltoall", "deepep"] + (["hybridep"] if nvidia else [])
        d["moe_a2a_overlap"] = [False, True]
        if m.num_shared_experts:
            d["moe_shared_expert_overlap"] = [False, True]
        if megatron:
            d["moe_router_fusion"] = [False, True]
            if hw.sm100_class:
                d["fused_grouped_mlp"] = [False, True]
    if nvidia and megatron:
        d["cuda_graph_impl"] = ["none", "transformer_engine", "full_iteration"]
        d["cuda_graph_scope"] = [()] + ([("attn", "moe_router", "moe_preprocess")] if m.is_moe else [])
    if hw.supports("fp8"):
        d["fp8_param_gather"] = [False, True]
    return d


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(0, max(1, limit).bit_length()) if (1 << i) <= limit]


def _divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and (limit is None or d <= limit)]


def _sort_key(v: Any) -> tuple:
    # None first, then numbers, then strings; bools as numbers (False < True)
    if v is None:
        return (0, 0, "")
    if isinstance(v, (bool, int, float)):
        return (1, float(v), "")
    return (2, 0, str(v))


def _coerce_field(name: str, value: Any) -> Any:
    v = coerce(value, _HINTS[name], f"training.{name}")
    return v


class SearchSpace:
    """Axes with their value lists around a baseline run, and the legal points among them."""

    def __init__(self, baseline: RunConfig, *, pins: Mapping[str, Any] | None = None,
                 restrict: Mapping[str, Sequence[Any]] | None = None, allow: Sequence[str] = ()) -> None:
        pins, restrict = dict(pins or {}), dict(restrict or {})
        problems = [f"space.allow: unknown group {g!r}; valid: {', '.join(ALLOW_GROUPS)}"
                    for g in allow if g not in ALLOW_GROUPS]
        problems += unknown_key_problems(pins, list(FIELDS), "space.pin")
        problems += unknown_key_problems(restrict, list(FIELDS), "space.restrict")
        for k in sorted(set(pins) & set(restrict)):
            problems.append(f"space: axis {k!r} is both pinned and restricted; give one of the two")
        values: dict[str, list[Any]] = {}
        for k, v in pins.items():
            if k in FIELDS:
                try:
                    values[k] = [_coerce_field(k, v)]
                except ValueError as exc:
                    problems.append(f"space.pin: {exc}")
        for k, vs in restrict.items():
            if k not in FIELDS:
                continue
            if not isinstance(vs, (list, tuple)) or not vs:
                problems.append(f"space.restrict.{k}={vs!r} must be a non-empty list of values")
                continue
            try:
                values[k] = [_coerce_field(k, v) for v in vs]
            except ValueError as exc:
                problems.append(f"space.restrict: {exc}")
        if problems:
            raise InvalidConfigError(problems)
        held = {k: v[0] for k, v in values.items() if len(v) == 1}
        # canonical form, but a pinned value stays what the user pinned (a pinned HybridEP dispatcher on a baseline
        # with EP 1, where canonical form would write alltoall, is every point's dispatcher)
        base_t = self._canonical_training(baseline.training.replace(**held))
        base_t = base_t.replace(**{k: v for k, v in held.items() if k in pins and getattr(base_t, k) != v})
        self.baseline: RunConfig = dataclasses.replace(baseline, training=base_t)
        """The baseline in canonical form (pins applied, 'auto' schedule resolved)."""
        defaults = self._default_values(self.baseline)
        for group in dict.fromkeys(allow):
            defaults.update(numerics_defaults(self.baseline, group))
        axes: dict[str, tuple[Any, ...]] = {}
        for name in CANONICAL_ORDER:
            base_v = getattr(base_t, name)
            vs = values.get(name, defaults.get(name, [base_v]))
            if name in restrict or name in pins:
                vs = list(dict.fromkeys(vs))  # user order kept, duplicates dropped
            elif name in ORDINAL_AXES:
                vs = sorted(set(vs) | {base_v}, key=_sort_key)
            else:
                vs = list(dict.fromkeys([*vs, base_v]))  # default order, baseline appended if new
            if name == "pp_schedule":
                vs = [v if v != "auto" else base_t.schedule for v in vs]
                vs = list(dict.fromkeys(vs))
            axes[name] = tuple(vs)
        self.values: dict[str, tuple[Any, ...]] = axes
        """Every field's allowed values (one value = held fixed)."""
        self.axes: tuple[str, ...] = tuple(n for n in CANONICAL_ORDER if len(axes[n]) > 1)
        """The searched axes (two or more values), in canonical order."""
        self.pins, self.restrict, self.allow = pins, restrict, tuple(dict.fromkeys(allow))
        self._derive_layout = not any(k in pins or k in restrict for k in LAYOUT_KEYS)
        self._layouts: dict[tuple[int, int], dict[str, Any]] = {}
        if self._derive_layout:
            self.baseline = dataclasses.replace(self.baseline, training=base_t.replace(
                **self._layout_for(base_t.pp, base_t.vpp)))

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def _default_values(run: RunConfig) -> dict[str, list[Any]]:
        m, n, hw = run.model, run.cluster.num_gpus, run.cluster.hardware
        d: dict[str, list[Any]] = {
            "tp": _powers_of_two(min(hw.gpus_per_node, n)),
            "cp": [c for c in (1, 2, 4, 8) if n % c == 0],
            "pp": _divisors(n, m.num_layers),
            "vpp": [1, 2, 3, 4],
            "pp_schedule": [n for n, s in SCHEDULES.items() if s.searched_by_default],
            "mbs": [1, 2, 4, 8],
            "recompute": ["none", "selective", "full"],
            "use_distributed_optimizer": [False, True],
            "fsdp": [False, True],
        }
        if m.is_moe:
            d["ep"] = _divisors(m.num_experts, n)
            d["moe_a2a_backend"] = ["alltoall", "deepep"]
            d["moe_sync_free"] = [False, True] if hw.vendor.lower() == "amd" else [False]  # Primus-Turbo: AMD
        return d

    @staticmethod
    def _canonical_training(t: TrainingConfig) -> TrainingConfig:
        changes: dict[str, Any] = {}
        if t.pp_schedule == "auto":
            changes["pp_schedule"] = t.schedule
        if t.ep == 1 and t.moe_a2a_backend != "alltoall":
            changes["moe_a2a_backend"] = "alltoall"
        if t.moe_sync_free and changes.get("moe_a2a_backend", t.moe_a2a_backend) != "deepep":
            changes["moe_sync_free"] = False
        if t.fsdp and t.use_distributed_optimizer:
            changes["use_distributed_optimizer"] = False
        return t.replace(**changes) if changes else t

    def _layout_for(self, pp: int, vpp: int) -> dict[str, Any]:
        """The pipeline layout keys a point with this (pp, vpp) runs with (see LAYOUT_KEYS); {} when
        the user pinned or restricted them (then they are axes like any other)."""
        if not self._derive_layout:
            return {}
        hit = self._layouts.get((pp, vpp))
        if hit is None:
            base = self.baseline.training
            hit = {k: getattr(base, k) for k in LAYOUT_KEYS}
            if (pp, vpp) != (base.pp, base.vpp) or hit == _LAYOUT_DEFAULTS:
                m = self.baseline.model
                hit = dict(_LAYOUT_DEFAULTS)
                n_virtual = pp * vpp
                # derived where the ranks cannot hold equal layer counts (num_layers % pp), while every
                # virtual stage can hold a layer (embedding and loss counting one each, Megatron's
                # account_for_* convention). A vpp that does not split an even per-rank count stays
                # illegal, as Megatron checks it and the paper's seed order (App. C.1) skips it.
                n = m.pipeline_layers
                if pp >= 1 and vpp >= 1 and n % pp and n + 2 >= n_virtual:
                    opts = uneven_options(n, pp, vpp, m.mtp_layers, card_weights(m))
                    if opts:
                        hit.update(opts[0])
            self._layouts[(pp, vpp)] = hit
        return hit

    def _with_layout(self, t: TrainingConfig) -> TrainingConfig:
        lay = self._layout_for(t.pp, t.vpp)
        return t.replace(**lay) if lay and any(getattr(t, k) != v for k, v in lay.items()) else t

    # ------------------------------------------------------------------ points and runs
    def point_of(self, run_or_training: RunConfig | TrainingConfig | Mapping[str, Any]) -> dict[str, Any]:
        """The searched-axis values of a run, training config or mapping (canonical form)."""
        if isinstance(run_or_training, RunConfig):
            t = run_or_training.training
        elif isinstance(run_or_training, TrainingConfig):
            t = run_or_training
        else:  # a result's training (JSON form): a tuple-valued field (cuda_graph_scope, ...) comes as a list
            t = self.baseline.training.replace(**{k: _coerce_field(k, v) if isinstance(v, list) and k in _HINTS else v
                                                  for k, v in run_or_training.items()})
        t = self._canonical_training(t)
        return {a: getattr(t, a) for a in self.axes}

    def validate(self, values: Mapping[str, Any]) -> tuple[RunConfig | None, list[str]]:
        """Build the candidate ``baseline + values``; return (run, []) or (run or None, problems).

        Problems name every unknown key, badly typed value, value outside the space and legality
        failure; the run is returned whenever it could be built (so its key can be recorded).
        """
        if not isinstance(values, Mapping):
            return None, [f"a candidate must be a mapping of training keys to values, got {type(values).__name__}"]
        problems = unknown_key_problems(dict(values), list(FIELDS), "candidate")
        changes: dict[str, Any] = {}
        for k, v in values.items():
            if k not in FIELDS:
                continue
            try:
                changes[k] = _coerce_field(k, v)
            except ValueError as exc:
                problems.append(str(exc))
        t = self._with_layout(self._canonical_training(self.baseline.training.replace(**changes)))
        run = dataclasses.replace(self.baseline, training=t)
        for name in CANONICAL_ORDER:
            if self._derive_layout and name in LAYOUT_KEYS:
                continue  # derived from (pp, vpp), not searched
            v = getattr(t, name)
            allowed = self.values[name]
            if v not in allowed:
                shown = ", ".join("null" if a is None else str(a) for a in allowed)
                problems.append(f"{name}={'null' if v is None else v} is outside the search space "
                                f"({name} in {{{shown}}})")
        parse_problems = bool(problems)
        problems += legality_check(run)
        return (None if parse_problems else run), problems

    def make(self, values: Mapping[str, Any]) -> RunConfig:
        """Like :meth:`validate` but raise InvalidConfigError listing every problem."""
        run, problems = self.validate(values)
        if problems:
            raise InvalidConfigError(problems)
        assert run is not None
        return run

    def contains(self, values: Mapping[str, Any]) -> bool:
        return not self.validate(values)[1]

    def run_of(self, point: Sequence[Any] | Mapping[str, Any]) -> RunConfig:
        """The RunConfig of an enumerated point (a tuple in :attr:`axes` order or a mapping); unchecked."""
        if not isinstance(point, Mapping):
            point = dict(zip(self.axes, point))
        return dataclasses.replace(self.baseline, training=self._with_layout(self.baseline.training.replace(**point)))

    # ------------------------------------------------------------------ enumeration
    @staticmethod
    def _is_canonical(kw: Mapping[str, Any]) -> bool:
        """The kwargs form of :meth:`_canonical_training` (no object built)."""
        return not (kw["pp_schedule"] == "auto" or (kw["ep"] == 1 and kw["moe_a2a_backend"] != "alltoall")
                    or (kw["moe_sync_free"] and kw["moe_a2a_backend"] != "deepep")
                    or (kw["fsdp"] and kw["use_distributed_optimizer"]))

    def _refused_by_a_flag_rule(self, t_kwargs: dict[str, Any], structural: set[str]) -> bool:
        """Some rule group of the oracle's (``oracle.legality.RULES``, each applied by every check) refuses these
        settings having read none of the ``structural`` fields: then no structure can make them legal (the check is
        a deterministic function of the fields it reads), and the enumeration need not try each one."""
        try:
            t = _ReadTracked.of({**t_kwargs, **self._layout_for(t_kwargs["pp"], t_kwargs["vpp"])})
        except TypeError:
            return False
        run = RunConfig(model=self.baseline.model, cluster=self.baseline.cluster, training=t)
        for rule in LEGALITY_RULES:
            t.forget()
            if rule(run) and not structural & set(t.reads()):
                return True
        return False

    def _legal_kwargs(self, t_kwargs: dict[str, Any], *, canonical: bool) -> bool:
        if canonical and not self._is_canonical(t_kwargs):
            return False
        kw = {**t_kwargs, **self._layout_for(t_kwargs["pp"], t_kwargs["vpp"])}
        return self._verdicts.legal(kw, lambda t: not legality_check(
            RunConfig(model=self.baseline.model, cluster=self.baseline.cluster, training=t)))

    @cached_property
    def _verdicts(self) -> "_ReadMemo":
        return _ReadMemo()

    @cached_property
    def points(self) -> tuple[tuple[Any, ...], ...]:
        """Every legal point, as value tuples in :attr:`axes` order (enumerated once, then cached)."""
        base = {f: getattr(self.baseline.training, f) for f in FIELDS}
        s_axes = [a for a in self.axes if a in STRUCTURE_AXES]
        f_axes = [a for a in self.axes if a not in STRUCTURE_AXES]
        s_ok = [s for s in itertools.product(*(self.values[a] for a in s_axes))
                if self._legal_kwargs({**base, **dict(zip(s_axes, s))}, canonical=False)]

        structural = set(s_axes) | set(LAYOUT_KEYS)  # LAYOUT_KEYS: derived from pp and vpp

        def flags_ok(f: tuple[Any, ...]) -> bool:
            # a flag combination legal with the baseline's structure, or else with some legal structure: pinned
            # settings can need a structure the baseline does not have (EP > 1 for an all-to-all overlap, HybridEP's
            # static budget). Every bundled experiment's space lists the same points either way.
            kw = {**base, **dict(zip(f_axes, f))}
            if self._legal_kwargs(kw, canonical=False):
                return True
            if self._refused_by_a_flag_rule(kw, structural):
                return False
            # what no structure makes canonical (the dispatcher's ep rule aside) is not scanned
            if (kw["moe_sync_free"] and kw["moe_a2a_backend"] != "deepep") or (
                    kw["fsdp"] and kw["use_distributed_optimizer"]):
                return False
            return any(self._legal_kwargs({**kw, **dict(zip(s_axes, s))}, canonical=False) for s in s_ok)

        f_ok = [f for f in itertools.product(*(self.values[a] for a in f_axes)) if flags_ok(f)]
        order = [self.axes.index(a) for a in s_axes + f_axes]
        inverse = sorted(range(len(order)), key=order.__getitem__)
        out = []
        for s in s_ok:
            sd = {**base, **dict(zip(s_axes, s))}
            for f in f_ok:
                if not self._legal_kwargs({**sd, **dict(zip(f_axes, f))}, canonical=True):
                    continue
                row = s + f
                out.append(tuple(row[i] for i in inverse))
        return tuple(out)

    def iter_points(self) -> Iterator[dict[str, Any]]:
        for p in self.points:
            yield dict(zip(self.axes, p))

    def values_of(self, point: Sequence[Any] | Mapping[str, Any]) -> dict[str, Any]:
        """The training values that turn the baseline into this point's run (``baseline.training.replace(
        **values)`` is :meth:`run_of`'s training): the point's axes plus each derived pipeline layout key
        (LAYOUT_KEYS) whose value differs from the baseline's. What goes to a scorer that knows only the
        baseline (``raytune_primus.pool``): the bare axes would leave a pp that does not split the layers
        without its uneven layout, or keep the baseline's layout for another pp."""
        values = dict(point) if isinstance(point, Mapping) else dict(zip(self.axes, point))
        base = self.baseline.training
        lay = self._layout_for(values.get("pp", base.pp), values.get("vpp", base.vpp))
        values.update({k: v for k, v in lay.items() if getattr(base, k) != v})
        return values

    def iter_values(self) -> Iterator[dict[str, Any]]:
        """:meth:`values_of` every legal point, in :attr:`points` order."""
        for p in self.points:
            yield self.values_of(p)

    def point(self, i: int) -> dict[str, Any]:
        return dict(zip(self.axes, self.points[i]))

    @property
    def size(self) -> int:
        """Number of legal points."""
        return len(self.points)

    @property
    def raw_size(self) -> int:
        """Size of the full cross product of the axis values (legal or not)."""
        return math.prod(len(self.values[a]) for a in self.axes)

    @cached_property
    def num_layouts(self) -> int:
        """Distinct parallel layouts (tp, cp, pp, vpp, ep, etp) among the legal points."""
        idx = [i for i, a in enumerate(self.axes) if a in PARALLEL_AXES]
        return len({tuple(p[i] for i in idx) for p in self.points})

    @cached_property
    def _index_array(self):
        import numpy as np
        pos = {a: {v: i for i, v in enumerate(self.values[a])} for a in self.axes}
        arr = np.array([[pos[a][v] for a, v in zip(self.axes, p)] for p in self.points], dtype=np.int16)
        return arr.reshape(len(self.points), len(self.axes))

    def nearest(self, values: Mapping[str, Any]) -> dict[str, Any] | None:
        """The legal point closest to ``values`` (index distance on numeric axes, mismatch count on
        the others; ties go to the first enumerated point). None for an empty space."""
        import numpy as np
        if not self.points:
            return None
        x = []
        for a in self.axes:
            vs = self.values[a]
            v = values.get(a, getattr(self.baseline.training, a))
            x.append(vs.index(v) if v in vs else -100)
        arr = self._index_array
        d = np.abs(arr - np.array(x, dtype=np.int16))
        cat = [i for i, a in enumerate(self.axes) if a not in ORDINAL_AXES]
        if cat:
            d[:, cat] = np.minimum(d[:, cat], 1)
        return self.point(int(np.argmin(d.sum(axis=1))))

    # ------------------------------------------------------------------ neighbourhoods
    def neighbours(self, point: Mapping[str, Any], axis: str) -> list[Any]:
        """Other values of ``axis`` next to ``point[axis]``: adjacent ones for numeric axes, all for others."""
        vals = self.values[axis]
        cur = point.get(axis, getattr(self.baseline.training, axis))
        if axis in ORDINAL_AXES and all(isinstance(v, (int, float)) for v in vals):
            ordered = sorted(vals)
            if cur not in ordered:
                return ordered
            i = ordered.index(cur)
            return [ordered[j] for j in (i - 1, i + 1) if 0 <= j < len(ordered)]
        return [v for v in vals if v != cur]

    # ------------------------------------------------------------------ descriptions
    def describe(self) -> dict[str, Any]:
        """JSON-ready view: searched axes with their values, fixed values, sizes."""
        fixed = {a: v[0] for a, v in self.values.items() if len(v) == 1}
        return {"axes": {a: list(self.values[a]) for a in self.axes}, "fixed": fixed,
                "canonical_rules": ["ep=1 implies moe_a2a_backend=alltoall",
                                    "moe_a2a_backend=alltoall implies moe_sync_free=false",
                                    "fsdp=true implies use_distributed_optimizer=false"],
                "baseline": self.point_of(self.baseline)}

    def numerics(self, winner: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Which numerics-changing axes (:data:`NUMERICS`) this space searches, and which of them a point
        (``winner``: training values, e.g. a search's winner config) takes away from the baseline."""
        base = self.baseline.training
        shown = [a for a in NUMERICS_AXES if self.baseline.model.is_moe or a not in NUMERICS["token_drop"]]
        out: dict[str, Any] = {"open": [a for a in NUMERICS_AXES if a in self.axes],
                               "baseline": {a: getattr(base, a) for a in shown}}
        if winner is not None:
            t = base.replace(**{k: v for k, v in winner.items() if k in NUMERICS_AXES})
            out["changed"] = {a: getattr(t, a) for a in NUMERICS_AXES if getattr(t, a) != getattr(base, a)}
        return out

    def software(self) -> dict[str, Any]:
        """The software settings (:data:`SOFTWARE`) this space searches (``open``), and those ``allow: [software]``
        would add on this part and model (``more``; not the ones the space pins or restricts)."""
        return {"open": [a for a in SOFTWARE if a in self.axes],
                "more": [a for a, vs in software_defaults(self.baseline).items()
                         if a not in self.axes and a not in self.pins and a not in self.restrict
                         and len(set(vs) | {getattr(self.baseline.training, a)}) > 1]}

    def summary(self) -> dict[str, Any]:
        return {"axes": len(self.axes), "raw_size": self.raw_size, "size": self.size,
                "num_layouts": self.num_layouts}

    @cached_property
    def fingerprint(self) -> str:
        """Stable id of (baseline, value lists): equal spaces share it across processes."""
        blob = json.dumps({"baseline": self.baseline.to_dict(),
                           "values": {a: list(v) for a, v in self.values.items()}},
                          sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]

    def __repr__(self) -> str:
        return (f"SearchSpace({self.baseline.model.name} on {self.baseline.cluster.num_gpus}x"
                f"{self.baseline.cluster.hardware.name}, axes={list(self.axes)})")


class _ReadTracked(TrainingConfig):
    """A TrainingConfig that records which fields are read (and their values): see :class:`_ReadMemo`."""

    @classmethod
    def of(cls, kw: Mapping[str, Any]) -> _ReadTracked:
        """The config of the training values ``kw``, recording from now on."""
        t = cls(**kw)
        t.forget()
        return t

    def forget(self) -> None:
        """Record afresh: what is read from now on."""
        object.__setattr__(self, "_reads", {})

    def reads(self) -> dict[str, Any]:
        """The fields read since :meth:`of` / :meth:`forget`, with their values."""
        return object.__getattribute__(self, "_reads")

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if name in _FIELD_SET:
            object.__getattribute__(self, "_reads")[name] = value
        return value


_FIELD_SET = frozenset(FIELDS)


class _ReadMemo:
    """Legality verdicts memoised on the fields the check read (dependency tracking, not a second copy of
    the rules): the check runs on a training config that records every field it reads, and its verdict is
    stored under those fields' values. The check is a deterministic function of the configuration (the
    model and cluster are the space's, fixed), so another configuration that agrees on every field a
    stored check read follows the same path through it and gets the same verdict. A space's points share
    most of what legality looks at (a flag combination is checked against the layout fields it reads, not
    against every structure), so most combinations are answered from the memo."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, ...], dict[tuple, bool]] = {}
        """Read field names (sorted) -> {their values: verdict}."""
        self._getters: list[tuple[tuple[str, ...], Any, dict[tuple, bool]]] = []
        """(names, an itemgetter of their values as a tuple, the group's verdicts), per group: the lookup's loop."""
        self.hits = 0
        self.misses = 0

    def legal(self, kw: dict[str, Any], check: Any) -> bool:
        try:
            for names, get, verdicts in self._getters:
                hit = verdicts.get(get(kw))
                if hit is not None:
                    self.hits += 1
                    return hit
        except TypeError:  # an unhashable value: checked without the memo
            return bool(check(TrainingConfig(**kw)))
        self.misses += 1
        t = _ReadTracked.of(kw)
        verdict = bool(check(t))
        reads = t.reads()
        names = tuple(sorted(reads))
        if names not in self.groups:
            self.groups[names] = {}
            one = operator.itemgetter(*names) if names else (lambda kw: ())
            get = one if len(names) != 1 else (lambda kw, _g=one: (_g(kw),))  # always a tuple
            self._getters.append((names, get, self.groups[names]))
        self.groups[names][tuple(reads[n] for n in names)] = verdict
        return verdict
