"""Experiment specs: model x cluster x baseline x space x searcher x budget, as one YAML file.

::

    name: mixtral-8x22b-mi355x-4node      # optional; default = file name
    description: free text
    model: mixtral-8x22b                  # card name, card path, or an inline card mapping
    cluster: {hardware: mi355x, num_gpus: 32}
    baseline:                             # the training section of the starting configuration
      seq_len: 8192
      gbs: 512
      tp: 1
      ...
    space:                                # optional
      pin: {gbs: 512}                     # axis -> the one value it may take
      restrict: {cp: [1, 2]}              # axis -> the values it may take
      allow: [precision]                  # numerics groups (or software) opened with their default values
    searcher:                             # optional; default seed_llm with no options
      name: seed_llm                      # seed_llm | tpe | gp | random | grid
      options: {patience: 5}
      llm:                                # optional: the LLM proposer (else the offline one)
        model: openai/gpt-4o
        api_base: http://127.0.0.1:4000
        api_key_env: OPENAI_API_KEY       # the NAME of the variable holding the key
        timeout_s: 300
        max_tokens: 8000
    budget: 30                            # trials (pre-filter rejections count, as in the paper)
    seed: 0
    oracle_mode: simulate                 # simulate | benchmark

Every key is checked; unknown ones are named with a close match, and every problem is reported
at once in one InvalidConfigError.

Numerics are the user's: the axes that change what is trained (``searchers.space.NUMERICS``: precision
and FP8 recipe, FP8 activations, token dropping) keep the baseline's value unless ``space.restrict``
lists them or ``space.allow`` names their group (precision | fp8_activations | token_drop).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from oracle.config import RunConfig
from oracle.errors import InvalidConfigError, PrimusError, UnknownComponentError
from oracle.schema import unknown_key_problems
from oracle.yamlio import load_mapping

EXPERIMENT_DIR = Path(__file__).resolve().parents[1] / "experiments"
MAX_SEED = 2**32 - 1
"""Largest seed every searcher takes (Optuna's samplers seed numpy's MT19937, which takes 0..2**32-1)."""
TOP_KEYS = ["name", "description", "model", "cluster", "baseline", "space", "searcher", "budget", "seed",
            "oracle_mode"]
ORACLE_MODES = ("simulate", "benchmark", "synthetic")


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """A parsed experiment spec (see the module doc for the YAML)."""

    name: str
    """Experiment name (ledger run ids start with it)."""
    baseline: RunConfig
    """The starting configuration the seed planner anchors on."""
    description: str = ""
    pins: dict[str, Any] = field(default_factory=dict)
    """Axes held at one value."""
    restrict: dict[str, list[Any]] = field(default_factory=dict)
    """Axes limited to the listed values."""
    allow: tuple[str, ...] = ()
    """Groups opened with their default values: numerics groups (``searchers.space.NUMERICS``) or ``software``
    (``searchers.space.SOFTWARE``)."""
    searcher: str = "seed_llm"
    """Registered searcher name."""
    options: dict[str, Any] = field(default_factory=dict)
    """Searcher options."""
    llm: Any = None
    """:class:`searchers.llm.LLMSettings` or None (offline proposer)."""
    budget: int = 30
    """Trial budget."""
    seed: int = 0
    oracle_mode: str = "simulate"
    source: str = ""
    """File it was loaded from ('' when built in code)."""

    @cached_property
    def space(self):
        from searchers.space import SearchSpace
        return SearchSpace(self.baseline, pins=self.pins, restrict=self.restrict, allow=self.allow)

    def searcher_options(self, name: str | None = None) -> dict[str, Any]:
        """Options for searcher ``name`` (the spec's options and LLM block apply to the spec's searcher)."""
        name = name or self.searcher
        if name != self.searcher:
            return {}
        opts = dict(self.options)
        if self.llm is not None and name == "seed_llm":
            opts["llm"] = self.llm
        return opts

    def with_changes(self, **changes: Any) -> "Experiment":
        import dataclasses
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_dict(cls, data: Any, *, name: str = "experiment", source: str = "") -> "Experiment":
        where = name
        if not isinstance(data, dict):
            raise InvalidConfigError(f"{where}: an experiment spec must be a mapping with keys {', '.join(TOP_KEYS)}")
        problems = unknown_key_problems(data, TOP_KEYS, where)
        for req in ("model", "cluster", "baseline"):
            if req not in data:
                problems.append(f"{where}: missing required key {req!r}")
        name = str(data.get("name") or name)
        baseline = None
        if all(k in data for k in ("model", "cluster", "baseline")):
            try:
                baseline = RunConfig.from_dict({"model": data["model"], "cluster": data["cluster"],
                                                "training": data["baseline"]}, where=where)
            except InvalidConfigError as exc:
                problems += [p.replace(f"{where}.training", f"{where}.baseline") for p in exc.problems]
        space = data.get("space") or {}
        pins, restrict, allow = {}, {}, []
        if not isinstance(space, dict):
            problems.append(f"{where}.space must be a mapping with keys pin, restrict, allow")
        else:
            problems += unknown_key_problems(space, ["pin", "restrict", "allow"], f"{where}.space")
            pins = space.get("pin") or {}
            restrict = space.get("restrict") or {}
            allow = space.get("allow") or []
            if isinstance(allow, str):
                allow = [a.strip() for a in allow.split(",") if a.strip()]
            if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
                problems.append(f"{where}.space.allow must be a list of groups (numerics groups or software), "
                                f"got {allow!r}")
                allow = []
            if not isinstance(pins, dict):
                problems.append(f"{where}.space.pin must be a mapping axis -> value, got {pins!r}")
                pins = {}
            if not isinstance(restrict, dict):
                problems.append(f"{where}.space.restrict must be a mapping axis -> [values], got {restrict!r}")
                restrict = {}
        searcher, options, llm = "seed_llm", {}, None
        sdata = data.get("searcher", {})
        if isinstance(sdata, str):
            sdata = {"name": sdata}
        if not isinstance(sdata, dict):
            problems.append(f"{where}.searcher must be a name or a mapping with keys name, options, llm")
            sdata = {}
        problems += unknown_key_problems(sdata, ["name", "options", "llm"], f"{where}.searcher")
        searcher = sdata.get("name", "seed_llm")
        options = sdata.get("options") or {}
        if not isinstance(options, dict):
            problems.append(f"{where}.searcher.options must be a mapping, got {options!r}")
            options = {}
        problems += _check_searcher(searcher, options, f"{where}.searcher")
        if sdata.get("llm") is not None:
            from searchers.llm import LLMSettings
            try:
                llm = LLMSettings.from_dict(sdata["llm"], f"{where}.searcher.llm")
            except InvalidConfigError as exc:
                problems += exc.problems
            if searcher != "seed_llm":
                problems.append(f"{where}.searcher.llm only applies to searcher seed_llm, not {searcher!r}")
        budget, seed = data.get("budget", 30), data.get("seed", 0)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            problems.append(f"{where}.budget={budget!r} must be a positive integer (trials)")
        if isinstance(seed, bool) or not isinstance(seed, int):
            problems.append(f"{where}.seed={seed!r} must be an integer")
        elif not 0 <= seed <= MAX_SEED:
            problems.append(f"{where}.seed={seed} must be in 0..{MAX_SEED} (the searchers' generators take 32-bit "
                            f"seeds)")
        mode = data.get("oracle_mode", "simulate")
        if mode not in ORACLE_MODES:
            problems.append(f"{where}.oracle_mode={mode!r} is not one of {' | '.join(ORACLE_MODES)}")
        exp = None
        if not problems:
            assert baseline is not None
            exp = cls(name=name, baseline=baseline, description=str(data.get("description", "")), pins=dict(pins),
                      restrict={k: list(v) if isinstance(v, (list, tuple)) else v for k, v in restrict.items()},
                      allow=tuple(allow), searcher=searcher, options=dict(options), llm=llm, budget=budget,
                      seed=seed, oracle_mode=mode, source=source)
            try:
                exp.space  # noqa: B018 - validates pins and restrictions
            except InvalidConfigError as exc:
                problems += [f"{where}.{p}" if p.startswith("space") else p for p in exc.problems]
        if problems:
            raise InvalidConfigError(problems)
        assert exp is not None
        return exp


def _check_searcher(name: Any, options: dict[str, Any], where: str) -> list[str]:
    from searchers.base import get_searcher
    try:
        cls = get_searcher(str(name))
    except UnknownComponentError as exc:
        return [f"{where}.name: {exc}"]
    params = inspect.signature(cls.__init__).parameters
    valid = [p for p in params if p not in ("self", "space", "seed") and params[p].kind == params[p].KEYWORD_ONLY
             and p not in ("lm",)]
    return unknown_key_problems(options, valid, f"{where}.options")


def bundled() -> list[str]:
    """Names of the experiment specs shipped in ``experiments/``."""
    return sorted(p.stem for p in EXPERIMENT_DIR.glob("*.yaml"))


def shipped() -> list[str]:
    """Names of every experiment spec shipped: ``experiments/`` and its suite folders (``experiments/SUITE/``)."""
    return sorted({p.stem for p in EXPERIMENT_DIR.glob("*.yaml")} | {p.stem for p in EXPERIMENT_DIR.glob("*/*.yaml")})


def _shipped_path(name: str) -> Path | None:
    """The shipped spec of that name: ``experiments/NAME.yaml``, else the one suite folder holding it."""
    top = EXPERIMENT_DIR / f"{name}.yaml"
    if top.exists():
        return top
    hits = sorted(EXPERIMENT_DIR.glob(f"*/{name}.yaml"))
    return hits[0] if hits else None


def load_experiment(name_or_path: str | Path) -> Experiment:
    """Load a spec by path, or by the name of a shipped spec (``experiments/NAME.yaml`` or a suite's
    ``experiments/SUITE/NAME.yaml``)."""
    from oracle.registry import check_name

    p = Path(check_name("experiment", str(name_or_path)))
    if not p.exists():
        cand = _shipped_path(str(name_or_path)) if "/" not in str(name_or_path) else None
        if cand is not None:
            p = cand
        elif p.suffix in (".yaml", ".yml", ".json") or "/" in str(name_or_path):
            raise InvalidConfigError(f"experiment file {str(name_or_path)!r} does not exist")
        else:
            raise UnknownComponentError("experiment", str(name_or_path), shipped())
    try:
        data = load_mapping(p, "experiment spec")
    except PrimusError:
        raise
    return Experiment.from_dict(data, name=p.stem, source=str(p))
