"""An experiment from a model and a cluster, without a file: what ``raytune-primus tune --model M --hardware H
--num-gpus N --seq-len S --gbs G`` runs and ``raytune-primus experiments init ... -o FILE`` writes.

:func:`derive_spec` returns the experiment spec as the mapping an experiment YAML holds
(:mod:`searchers.experiment`), so a derived search and the same search run from the written file are one
search. What it fills in:

- **space**: every default axis of :class:`~searchers.space.SearchSpace` around the baseline, the ILP schedule
  included (a search projects it in search mode, tens of milliseconds); GBS and sequence length held; what the user ``--set`` pinned; the numerics
  (precision and FP8 recipe, FP8 activations, token dropping) held at the user's values unless ``allow``
  opens their group.
- **baseline**: the first memory-legal point of the planner's walk (:func:`starting_point`): parallel
  layouts from the least model parallelism up (TP x CP x PP; at equal product the one with less pipeline
  and context splitting, i.e. more tensor parallelism inside a node; MoE: expert parallelism inside a node,
  widest first), each with the seed planner's memory savers from the cheapest (no recompute, selective,
  FSDP, full recompute), MBS 1, no interleaving; the first one the memory pre-filter passes.
- **searcher** seed_llm (offline proposer), **budget** 30 trials (the paper's), seed 0, the simulate oracle.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from collections.abc import Iterator, Sequence
from typing import Any

from oracle.config import FRAMEWORK_DEFAULTS, RunConfig, TrainingConfig, apply_overrides
from oracle.errors import InvalidConfigError
from oracle.schema import to_dict
from oracle.units import GIB
from searchers.space import ALLOW_GROUPS, SearchSpace

DEFAULT_BUDGET = 30
"""Trials (the paper's budget, App. C)."""
DEFAULT_SEARCHER = "seed_llm"
SAVERS: tuple[tuple[str, bool], ...] = (("none", False), ("selective", False), ("none", True), ("selective", True),
                                        ("full", False), ("full", True))
"""(recompute, fsdp) from the cheapest memory saver to the dearest: the order the walk tries at each layout."""
CORE_KEYS: tuple[str, ...] = ("seq_len", "gbs", "mbs", "tp", "pp", "vpp", "cp", "ep", "pp_schedule", "recompute",
                              "precision", "use_distributed_optimizer", "fsdp")
"""Training keys every derived baseline writes, default or not (the rest only where they differ)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Derived:
    """A derived experiment: the spec mapping and how it was found."""

    spec: dict[str, Any]
    """The experiment spec (what an experiment YAML holds)."""
    baseline_peak_bytes: float
    """The baseline's memory per GPU as the pre-filter projects it."""
    cap_bytes: float
    """The memory cap the pre-filter compares it with."""
    tried: int
    """Legal points of the walk before the baseline (each over the cap)."""
    command: str
    """The command line that derives it (the written file's first comment)."""
    numerics: dict[str, Any]
    """``SearchSpace.numerics()`` of the derived space: which numerics are open, and the baseline's."""

    def yaml(self) -> str:
        """The spec as an experiment YAML with comments saying where each part came from."""
        import yaml

        s = self.spec
        t = s["baseline"]
        layout = " ".join(f"{k.upper()}{t[k]}" for k in ("tp", "cp", "pp", "ep") if k in t)
        savers = f"recompute {t['recompute']}" + (", FSDP" if t.get("fsdp") else "")
        allow = s["space"].get("allow") or []
        numerics = ", ".join(f"{a}={_shown(v)}" for a, v in self.numerics["baseline"].items())
        pinned = ", ".join(s["space"].get("pin", {}))
        head = [f"# Derived by: {self.command}",
                "# Baseline: the first memory-legal point of the planner's walk (searchers/derive.py: least model",
                "# parallelism first, then the cheapest memory saver):",
                f"#   {layout}, {savers}, MBS {t['mbs']}: {self.baseline_peak_bytes / GIB:,.1f} of "
                f"{self.cap_bytes / GIB:,.1f} GiB per GPU (the walk's {self.tried} legal points before it do not fit).",
                "# Space: every default axis; GBS and sequence length held; pp_schedule the default set, ILP",
                "# included (search mode)" + (f"; held by --set: {pinned}" if pinned else "") + ".",
                f"# Numerics are the user's: {numerics}",
                f"#   opened (space.allow): {', '.join(a for a in allow if a != 'software')}."
                if set(allow) - {"software"} else
                "#   held; space.allow: [precision, token_drop, fp8_activations] would let the search change them.",
                "# Software settings (dispatcher and its overlaps, fused kernels, CUDA graphs, FP8 weight gathers): "
                + ("searched (space.allow: software)." if "software" in allow else
                   "held; space.allow: [software] would search them."),
                ""]
        return "\n".join(head) + yaml.dump(s, Dumper=_spec_dumper(), sort_keys=False, width=110)


_DEFAULTS = to_dict(TrainingConfig(seq_len=1, gbs=1))


def _spec_dumper() -> type:
    """A safe YAML dumper writing mappings as blocks and lists of scalars on one line (as the bundled specs do)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def flow_list(dumper: Any, data: list) -> Any:
        flow = all(not isinstance(x, (list, dict)) for x in data)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)
    Dumper.add_representer(list, flow_list)
    return Dumper


def _shown(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def default_schedules() -> list[str]:
    """The pipeline schedules a derived space searches: the registered default ones (ILP among them)."""
    from oracle.pipeline.schedules import SCHEDULES
    return [n for n, s in SCHEDULES.items() if s.searched_by_default]


def set_key(setting: str) -> str:
    """The training key a ``KEY=VALUE`` / ``training.KEY=VALUE`` setting names (``cluster.memory_margin`` as written)."""
    return setting.split("=", 1)[0].strip().removeprefix("training.")


def parse_allow(text: str | Sequence[str] | None) -> list[str]:
    """``precision,token_drop`` (or a list) as ``allow`` groups (numerics groups, ``software``); one-line error
    naming an unknown one."""
    if not text:
        return []
    items = [a.strip() for a in (text.split(",") if isinstance(text, str) else text) if a and a.strip()]
    bad = [a for a in items if a not in ALLOW_GROUPS]
    if bad:
        raise InvalidConfigError(f"--allow: unknown group {bad[0]!r}; valid: {', '.join(ALLOW_GROUPS)} "
                                 f"(comma-separated, e.g. --allow precision,token_drop)")
    return list(dict.fromkeys(items))


def _walk(space: SearchSpace) -> Iterator[dict[str, Any]]:
    """The planner's walk over the space (see the module doc), as candidate training values."""
    v, hw = space.values, space.baseline.cluster.hardware
    gpn = hw.gpus_per_node

    def ep_key(e: int) -> tuple[int, int]:  # inside a node widest first, then across nodes narrowest first
        return (0, -e) if e <= gpn else (1, e)

    layouts = sorted(((tp, cp, pp) for tp in v["tp"] for cp in v["cp"] for pp in v["pp"]),
                     key=lambda x: (x[0] * x[1] * x[2], x[2], x[1]))
    eps = sorted(v["ep"], key=ep_key)
    savers = [(r, f) for r, f in SAVERS if r in v["recompute"] and f in v["fsdp"]]
    mbs = min(v["mbs"])
    vpp = 1 if 1 in v["vpp"] else min(v["vpp"])
    sched = [s for s in ("1f1b", "interleaved") if s in v["pp_schedule"]] or list(v["pp_schedule"])
    for tp, cp, pp in layouts:
        for ep in eps:
            for recompute, fsdp in savers:
                yield {"tp": tp, "cp": cp, "pp": pp, "ep": ep, "mbs": mbs, "vpp": vpp,
                       "pp_schedule": sched[0 if vpp == 1 else -1], "recompute": recompute,
                       "recompute_num_layers": v["recompute_num_layers"][0], "fsdp": fsdp,
                       "use_distributed_optimizer": (not fsdp) and (True in v["use_distributed_optimizer"])}


def starting_point(space: SearchSpace, evaluator: Any = None, start: dict[str, Any] | None = None
                   ) -> tuple[RunConfig, float, float, int]:
    """The first point of the planner's walk that is legal and that the memory pre-filter passes:
    (run, peak bytes, cap bytes, points tried before it). ``start``: searched settings every walk step carries (a
    recipe's dispatcher, which the space's canonical baseline at EP 1 cannot). One-line error when none is."""
    if evaluator is None:
        from searchers.evaluator import OracleEvaluator
        evaluator = OracleEvaluator()
    tried = 0
    best: tuple[float, RunConfig] | None = None
    for values in _walk(space):  # distinct configurations: every walk step differs in a layout or a saver
        run, problems = space.validate({**values, **(start or {})})
        if problems or run is None:
            continue
        mem = evaluator.memory(run)
        if mem.peak_bytes <= mem.cap_bytes:
            return run, float(mem.peak_bytes), float(mem.cap_bytes), tried
        tried += 1
        if best is None or mem.peak_bytes < best[0]:
            best = (float(mem.peak_bytes), run)
    b = space.baseline
    what = f"{b.model.name} on {b.cluster.num_gpus} x {b.cluster.hardware.name} at seq_len {b.training.seq_len}, " \
           f"gbs {b.training.gbs}"
    if best is None:
        raise InvalidConfigError(f"no legal configuration of {what}: check that the GPU count, the global batch "
                                 f"and any --set values fit together (e.g. gbs a multiple of the data-parallel size)")
    raise InvalidConfigError(f"no configuration of {what} fits in memory: the least memory of {tried} legal points "
                             f"is {best[0] / GIB:,.1f} GiB per GPU, over the cap of "
                             f"{b.cluster.memory_cap_bytes / GIB:,.1f} GiB (more GPUs, a shorter sequence, or "
                             f"--allow precision / fp8_activations)")


def derive_spec(*, model: str, hardware: str, num_gpus: int, seq_len: int, gbs: int, precision: str | None = None,
                sets: Sequence[str] = (), allow: Sequence[str] = (), name: str | None = None,
                searcher: str = DEFAULT_SEARCHER, budget: int = DEFAULT_BUDGET, seed: int = 0,
                evaluator: Any = None, starts: Sequence[str] = (), command: str | None = None) -> Derived:
    """Derive the experiment for ``model`` on ``num_gpus`` x ``hardware`` (see the module doc).

    ``sets``: ``KEY=VALUE`` training keys (``training.KEY`` or bare; ``cluster.memory_margin`` too) held at that
    value; ``allow``: numerics groups (and ``software``) the search may change; ``starts``: ``KEY=VALUE`` training
    keys the walk starts from but the space searches (a recipe's software settings under ``--allow software``);
    ``command``: the command line to record instead of the one these arguments spell. One-line errors for bad input."""
    allow = parse_allow(allow)
    training: dict[str, Any] = {"seq_len": seq_len, "gbs": gbs}
    if precision is not None:
        training["precision"] = precision
    for s in [*sets, *starts]:
        key = s.split("=", 1)[0].strip()
        if key in ("model", "cluster", "training") or (
                "." in key and not key.startswith("training.") and key != "cluster.memory_margin"):
            raise InvalidConfigError(f"--set {s!r}: only training keys (KEY=VALUE or training.KEY=VALUE) and "
                                     f"cluster.memory_margin may be set; the model and the cluster have their own flags")
    data = apply_overrides({"model": model, "cluster": {"hardware": hardware, "num_gpus": num_gpus},
                            "training": training}, [*starts, *sets])
    held = {set_key(s) for s in sets}  # pinned; starts are searched
    pins = {k: v for k, v in data["training"].items() if k not in ("seq_len", "gbs", "precision") and k in held}
    template = RunConfig.from_dict(data, where="derived", check=False)
    pins = {k: getattr(template.training, k) for k in pins}  # coerced ('8' -> 8) and checked by from_dict
    restrict = {"pp_schedule": default_schedules()} if "pp_schedule" not in pins else {}
    space = SearchSpace(template, pins=pins, restrict=restrict, allow=allow)
    run, peak, cap, tried = starting_point(space, evaluator, {k: getattr(template.training, k)
                                                              for k in map(set_key, starts) if k in space.axes})
    t = run.training
    framework = FRAMEWORK_DEFAULTS.get(t.framework, {})
    plain = to_dict(t)
    core = set(CORE_KEYS) - (set() if run.model.is_moe else {"ep"})
    baseline = {k: plain[k] for k in plain if k in core or k in framework or plain[k] != _DEFAULTS[k]}
    cluster = run.to_dict()["cluster"]
    model_ref = run.to_dict()["model"]
    if name is None:
        hw_name = hardware if isinstance(cluster["hardware"], str) else run.cluster.hardware.name
        name = f"{run.model.name}-{hw_name}-{num_gpus}gpu-seq{seq_len}-gbs{gbs}-{t.precision}"
        extra = {"set": sorted(sets), "allow": allow}
        if sets or allow:
            name += "-" + hashlib.sha1(json.dumps(extra).encode()).hexdigest()[:6]
    space_spec: dict[str, Any] = {}
    if pins:
        space_spec["pin"] = {k: list(v) if isinstance(v, tuple) else v for k, v in pins.items()}
    if restrict:
        space_spec["restrict"] = restrict
    if allow:
        space_spec["allow"] = allow
    spec = {"name": name,
            "description": f"{run.model.name} on {num_gpus} x {run.cluster.hardware.name}, seq {seq_len}, GBS {gbs} "
                           f"held; derived from the model and the cluster (baseline: the planner's first "
                           f"memory-legal point)",
            "model": model_ref, "cluster": cluster, "baseline": baseline, "space": space_spec,
            "searcher": {"name": searcher}, "budget": budget, "seed": seed, "oracle_mode": "simulate"}
    words = ["raytune-primus", "experiments", "init", "--model", model, "--hardware", hardware,
             "--num-gpus", str(num_gpus), "--seq-len", str(seq_len), "--gbs", str(gbs)]
    if precision is not None:
        words += ["--precision", precision]
    for s in sets:
        words += ["--set", s]
    if allow:
        words += ["--allow", ",".join(allow)]
    return Derived(spec=spec, baseline_peak_bytes=peak, cap_bytes=cap, tried=tried,
                   command=command or " ".join(shlex.quote(w) for w in words), numerics=space.numerics())

