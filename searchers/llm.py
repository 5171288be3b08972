"""The LLM cross-axis proposer (paper Sec. 3.2, Appendix C.2 and H) on DSPy.

Each round has two steps:

* a **planner** (``dspy.ChainOfThought(PlanSignature)``) reads the architecture, the cluster, the
  legal axes, the ledger summary, extra guidance and the scratchpad, and writes a rationale,
  hypotheses, candidate configurations as JSON, and a polish plan;
* an **executor** (``dspy.ReAct(SearchSignature)``) works through them with ten tools:
  ``evaluate``, ``evaluate_memory_only``, ``get_history``, ``get_best``, ``get_legal_axes``,
  ``get_architecture``, ``get_cluster``, ``get_budget_status``, ``note_to_scratchpad``,
  ``read_scratchpad``. (DSPy's recursive ``dspy.RLM`` needs a Deno sandbox; ReAct needs nothing.)

``evaluate`` does not call the oracle: it hands the candidate to the driver (the ask/tell loop,
through a greenlet so the tool loop reads like a plain function call) and returns what the
pre-filter and the oracle said. At most ``per_round`` (25) candidates per round, ``rounds`` (4)
rounds; a round stops when the incumbent has not improved for ``patience`` (5) trials, and the
search when the budget is spent.

Proposals are partial configurations laid over the baseline and validated against the space.
Malformed JSON, illegal axes, timeouts and endpoint errors are written to the ledger
(``llm_malformed`` / ``illegal`` / ``llm_timeout`` / ``llm_endpoint_error`` rows) and never stop
the search: when a round's LLM calls fail, the planner's remaining candidates are evaluated
directly, and after two failed rounds in a row the offline cross-axis proposer takes over (its
label then says so).

The model is any LiteLLM model string with ``api_base``; the API key is read from the environment
variable named by ``api_key_env`` when the LM is built, registered with the ledger's scrubber, and
never logged or stored.
"""
from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oracle.errors import InvalidConfigError
from oracle.schema import unknown_key_problems
from searchers.base import Candidate, SearchContext, TrialResult
from searchers.crossaxis import CrossAxisProposer, RoundControl
from searchers.history import History
from searchers.ledger import register_secret, scrub
from searchers.space import SearchSpace

log = logging.getLogger(__name__)
GIB = 2**30
_LLM_KEYS = ["model", "api_base", "api_key_env", "timeout_s", "max_tokens", "temperature", "engine",
             "num_retries", "max_iters"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMSettings:
    """The experiment's ``llm`` block."""

    model: str
    """Any LiteLLM model string, e.g. 'openai/gpt-4o' or 'anthropic/claude-sonnet-4-6'."""
    api_base: str | None = None
    """OpenAI-compatible endpoint (a LiteLLM gateway, a local server)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (the key itself is never in a file)."""
    timeout_s: float = 300.0
    """Per-call timeout (paper: 300 s)."""
    max_tokens: int = 8000
    """Completion limit per call (paper: 8000)."""
    temperature: float | None = None
    """Sampling temperature (None = the provider's default, as in the paper)."""
    engine: str = "litellm"
    """DSPy engine: 'litellm' (any LiteLLM model string), 'auto' or 'lm15' (DSPy's own client)."""
    num_retries: int = 0
    """Retries on transient errors (each retry can take up to timeout_s)."""
    max_iters: int = 40
    """ReAct tool steps per round."""

    @classmethod
    def from_dict(cls, data: Any, where: str = "searcher.llm") -> "LLMSettings":
        if isinstance(data, LLMSettings):
            return data
        if not isinstance(data, Mapping):
            raise InvalidConfigError(f"{where} must be a mapping with keys {', '.join(_LLM_KEYS)}")
        problems = unknown_key_problems(dict(data), _LLM_KEYS, where)
        if not isinstance(data.get("model"), str) or not data.get("model"):
            problems.append(f"{where}.model must be a LiteLLM model string such as 'openai/gpt-4o'")
        if "api_key" in data:
            problems.append(f"{where}: put the key in an environment variable and name it in api_key_env")
        for k in ("timeout_s",):
            if k in data and not (isinstance(data[k], (int, float)) and data[k] > 0):
                problems.append(f"{where}.{k}={data[k]!r} must be a positive number")
        for k in ("max_tokens", "max_iters"):
            if k in data and not (isinstance(data[k], int) and data[k] > 0):
                problems.append(f"{where}.{k}={data[k]!r} must be a positive integer")
        if "num_retries" in data and not (isinstance(data["num_retries"], int) and data["num_retries"] >= 0):
            problems.append(f"{where}.num_retries={data['num_retries']!r} must be an integer >= 0")
        if problems:
            raise InvalidConfigError(problems)
        return cls(**{k: data[k] for k in _LLM_KEYS if k in data})

    def build_lm(self) -> Any:
        """A ``dspy.LM`` for these settings (reads the key from the environment; no response cache)."""
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import dspy
        kwargs: dict[str, Any] = {"cache": False, "num_retries": self.num_retries, "timeout": self.timeout_s,
                                  "max_tokens": self.max_tokens}
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise LLMUnavailable(f"environment variable {self.api_key_env} (api_key_env) is not set")
            register_secret(key)
            kwargs["api_key"] = key
        return dspy.LM(self.model, engine=self.engine, **kwargs)


class LLMUnavailable(RuntimeError):
    """The LLM cannot be used at all (no key, no DSPy); the offline proposer runs instead."""


def llm_label(settings: Any, lm: Any = None) -> str:
    if settings is not None:
        model = settings.model if isinstance(settings, LLMSettings) else dict(settings).get("model", "?")
        return f"llm:{model}"
    return f"llm:{getattr(lm, 'model', type(lm).__name__)}"


# ---------------------------------------------------------------------------------------------- DSPy
def _signatures() -> tuple[Any, Any]:
    import dspy

    class PlanSignature(dspy.Signature):
        """Plan the next round of a search for the fastest memory-legal distributed-training configuration.

        You receive the model architecture, the cluster, the legal search axes (with the baseline and the
        fixed values), a summary of the trials so far (configuration changes versus the baseline, projected
        tokens/s/GPU, projected memory against the cap, and why any trial failed), extra guidance, and your
        scratchpad. Decide which axes matter most for this model on this cluster and propose candidate
        configurations that combine axes (for example recompute x dispatcher x pipeline schedule x
        micro-batch), not only single changes. Respect memory headroom: activations grow with the
        micro-batch and shrink with recompute, tensor and context parallelism; the pre-filter rejects any
        configuration projected over the cap. Keep expert-parallel groups inside a node when you can.
        Each candidate is a JSON object whose keys are axes from legal_axes; omitted keys keep the
        baseline value. Do not repeat configurations already in the history."""

        architecture: str = dspy.InputField(desc="model card (layers, hidden size, heads, experts, ...)")
        cluster: str = dspy.InputField(desc="hardware, GPU count, GPUs per node, HBM and memory cap")
        legal_axes: str = dspy.InputField(desc="JSON: searched axes with their allowed values, fixed values, baseline")
        history_summary: str = dspy.InputField(desc="JSON list of trials so far, best first")
        extra_guidance: str = dspy.InputField(desc="model- or cluster-specific hints (may be empty)")
        scratchpad: str = dspy.InputField(desc="notes from earlier rounds")
        rationale: str = dspy.OutputField(desc="what the history shows and which axes to move next")
        hypotheses: list[str] = dspy.OutputField(desc="at most 5 testable hypotheses")
        candidate_configs: str = dspy.OutputField(
            desc="JSON list of 5-8 objects; keys from legal_axes.axes, values from their lists")
        polish_plan: str = dspy.OutputField(desc="how to refine the winner if a candidate wins")

    class SearchSignature(dspy.Signature):
        """Run one round of the search with the tools. Every new candidate goes through evaluate(config);
        config is a JSON object of axis values (omitted axes keep the baseline). Workflow: read the
        scratchpad and the history; pick the next candidate from the plan that is not in the history;
        evaluate it; if it comes back illegal or over the memory cap, read the reason and adjust; after
        three to five evaluations note what you learned in the scratchpad. Stop (finish) when evaluate
        says STOP, when the budget is spent, or when the best result has not improved in the last five
        trials."""

        plan: str = dspy.InputField(desc="the planner's rationale, hypotheses and polish plan")
        candidate_configs: str = dspy.InputField(desc="JSON list of the planner's candidates")
        budget_status: str = dspy.InputField(desc="trials used and remaining")
        best_config: str = dspy.OutputField(desc="JSON of the best configuration found this round")
        summary: str = dspy.OutputField(desc="5-8 sentences on what was learned")
        next_steps: str = dspy.OutputField(desc="what the next round should try")

    return PlanSignature, SearchSignature


def parse_json(text: Any) -> Any:
    """JSON from an LLM answer: a dict/list as is, or text possibly wrapped in ``` fences."""
    if isinstance(text, (dict, list)):
        return text
    if not isinstance(text, str):
        raise ValueError(f"expected JSON text, got {type(text).__name__}")
    s = text.strip()
    m = re.search(r"```(?:json)?\s*(.*?)```", s, re.S)
    if m:
        s = m.group(1).strip()
    return json.loads(s)


def parse_candidates(text: Any, limit: int) -> list[dict[str, Any]]:
    """The planner's candidate list (at most ``limit``); ValueError when it is not a JSON list of objects."""
    data = parse_json(text)
    if isinstance(data, dict) and isinstance(data.get("candidates"), list):
        data = data["candidates"]
    if not isinstance(data, list) or not all(isinstance(c, dict) for c in data):
        raise ValueError("candidate_configs must be a JSON list of objects")
    return [dict(c) for c in data[:limit]]


def _classify(exc: BaseException) -> str:
    name = type(exc).__name__.lower()
    text = str(exc).lower()
    if "parse" in name or isinstance(exc, (ValueError, json.JSONDecodeError)) and "parse" in text:
        return "llm_malformed"
    if "timeout" in name or "timed out" in text or "timeout" in text:
        return "llm_timeout"
    if "adapter" in name or "parse" in text:
        return "llm_malformed"
    return "llm_endpoint_error"


def _exit_exception() -> type[BaseException]:
    from greenlet import GreenletExit
    return GreenletExit


class LLMProposer:
    """Planner + ReAct executor over a shared :class:`History` (see module doc)."""

    def __init__(self, space: SearchSpace, history: History, *, settings: Any = None, lm: Any = None,
                 extra_guidance: str = "", context: SearchContext | None = None, rounds: int = 4,
                 per_round: int = 25, patience: int = 5) -> None:
        self.space, self.history = space, history
        self.settings = LLMSettings.from_dict(settings) if settings is not None else None
        self._lm = lm
        self.extra_guidance = extra_guidance
        self.context = context
        self.control = RoundControl(rounds=rounds, per_round=per_round, patience=patience)
        self.base_label = llm_label(self.settings, lm)
        self.label = self.base_label
        self.counts = {"planner_calls": 0, "executor_calls": 0, "proposals": 0, "illegal": 0,
                       "llm_malformed": 0, "llm_timeout": 0, "llm_endpoint_error": 0}
        self.scratchpad: list[str] = []
        self._gr: Any = None
        self._result: TrialResult | None = None
        self._failed_rounds = 0
        self._fallback: CrossAxisProposer | None = None
        self._round_failed = False
        self._unavailable = ""
        self._max_iters = self.settings.max_iters if self.settings else 40

    def bind(self, context: SearchContext) -> None:
        self.context = context

    # ------------------------------------------------------------------ plumbing
    def _event(self, status: str, reason: str) -> None:
        self.counts[status] = self.counts.get(status, 0) + 1
        reason = scrub(reason)[:500]
        log.warning("LLM proposer round %d: %s: %s", self.control.round, status, reason)
        if self.context is not None:
            self.context.event(status=status, reason=reason, phase="llm", round=self.control.round,
                               proposer=self.label)

    def _get_lm(self) -> Any:
        if self._lm is None:
            assert self.settings is not None
            self._lm = self.settings.build_lm()
        return self._lm

    def _switch_to_fallback(self, why: str) -> None:
        self.label = f"{self.base_label} -> cross-axis (offline) fallback"
        self._event("llm_fallback", why)
        self._fallback = CrossAxisProposer(self.space, self.history, rounds=max(1, self.control.rounds
                                                                                - self.control.round + 1),
                                           per_round=self.control.per_round, patience=self.control.patience)

    # ------------------------------------------------------------------ ask / tell
    def suggest(self) -> Candidate | None:
        from greenlet import greenlet
        while True:
            if self._fallback is not None:
                return self._fallback.suggest()
            if self._gr is None or self._gr.dead:
                if self._unavailable:
                    self._switch_to_fallback(self._unavailable)
                    continue
                if self._gr is not None and self._round_failed:
                    self._failed_rounds += 1
                    if self._failed_rounds >= 2:
                        self._switch_to_fallback("two LLM rounds failed in a row")
                        continue
                elif self._gr is not None:
                    self._failed_rounds = 0
                if not self.control.start_round(self.history.best_value()):
                    return None
                self._round_failed = False
                self._gr = greenlet(self._run_round)
                msg = self._gr.switch()
            else:
                msg = self._gr.switch(self._result)
            if isinstance(msg, Candidate):
                return msg

    def observe(self, candidate: Candidate, result: TrialResult, counted: bool) -> None:
        if self._fallback is not None and candidate.phase != "llm":
            self._fallback.observe(candidate, result, counted)
            return
        self._result = result
        self.control.observed(result, counted)
        if result.status == "illegal":
            self.counts["illegal"] += 1

    def close(self) -> None:
        if self._gr is not None and not self._gr.dead:
            self._gr.throw(_exit_exception()())  # unwinds the tool loop (a BaseException: ReAct won't catch it)
        self._gr = None

    # ------------------------------------------------------------------ inside the greenlet
    def _propose(self, values: Any, note: str) -> dict[str, Any]:
        """Hand one proposal to the driver and return what became of it (runs in the greenlet)."""
        if self.control.round_over():
            return {"status": "STOP", "reason": "round over: candidate limit reached or no improvement "
                                                f"in the last {self.control.patience} trials"}
        status = self.context.budget_status() if self.context else None
        if status is not None and status["remaining"] <= 0:
            return {"status": "STOP", "reason": "trial budget spent"}
        if not isinstance(values, Mapping):
            self._event("llm_malformed", f"evaluate() got {type(values).__name__}, not a JSON object")
            return {"status": "error", "reason": "config must be a JSON object of axis values"}
        self.counts["proposals"] += 1
        self.control.proposed()
        cand = Candidate(values=dict(values), phase="llm", round=self.control.round, proposer=self.label,
                         note=note[:200])
        parent = self._gr.parent
        result = parent.switch(cand)
        return self._describe(result)

    def _describe(self, r: TrialResult | None) -> dict[str, Any]:
        if r is None:
            return {"status": "error", "reason": "no result"}
        best = self.history.best_value()
        return {"status": r.status, "legal": r.legal, "fits": r.fits,
                "tokens_per_s_per_gpu": None if r.value is None else round(r.value, 1),
                "memory_gib": None if r.peak_bytes is None else round(r.peak_bytes / GIB, 2),
                "cap_gib": None if r.cap_bytes is None else round(r.cap_bytes / GIB, 2),
                "reason": r.reason[:300], "best_so_far": None if best is None else round(best, 1)}

    def _tools(self) -> list[Any]:
        prop = self

        def evaluate(config: Any) -> str:
            """Project throughput and memory of one configuration (JSON object of axis values; omitted axes
            keep the baseline). Costs one trial of the budget unless it is illegal or already known."""
            try:
                values = parse_json(config)
            except (ValueError, TypeError) as exc:
                prop._event("llm_malformed", f"evaluate(): malformed JSON: {exc}")
                return json.dumps({"status": "error", "reason": f"malformed JSON: {exc}"})
            return json.dumps(prop._propose(values, "executor"), default=str)

        def evaluate_memory_only(config: Any) -> str:
            """Project only the memory of a configuration (free: no trial is spent)."""
            try:
                values = parse_json(config)
            except (ValueError, TypeError) as exc:
                return json.dumps({"status": "error", "reason": f"malformed JSON: {exc}"})
            if prop.context is None or not isinstance(values, Mapping):
                return json.dumps({"status": "error", "reason": "memory projection unavailable"})
            return json.dumps(prop.context.memory_only(values), default=str)

        def get_history(k: int = 30) -> str:
            """The last k trials (changes versus the baseline, throughput, memory, status, reason)."""
            return json.dumps(prop.history.summary(int(k)), default=str)

        def get_best() -> str:
            """The best configuration so far and its projected tokens/s/GPU."""
            b = prop.history.best()
            return json.dumps({"config": b.point, "tokens_per_s_per_gpu": round(b.result.value, 1)}
                              if b else {"config": None}, default=str)

        def get_legal_axes() -> str:
            """The searched axes with their allowed values, the fixed values and the baseline."""
            return json.dumps(prop.space.describe(), default=str)

        def get_architecture() -> str:
            """The model card."""
            return prop._architecture()

        def get_cluster() -> str:
            """The cluster: hardware, GPUs, GPUs per node, HBM."""
            return prop._cluster()

        def get_budget_status() -> str:
            """Trials used and remaining, and this round's state."""
            return prop._budget_text()

        def note_to_scratchpad(text: str) -> str:
            """Append a note to the scratchpad kept across rounds."""
            prop.scratchpad.append(str(text)[:1000])
            return "noted"

        def read_scratchpad() -> str:
            """Everything noted so far."""
            return "\n".join(prop.scratchpad) or "(empty)"

        return [evaluate, evaluate_memory_only, get_history, get_best, get_legal_axes, get_architecture,
                get_cluster, get_budget_status, note_to_scratchpad, read_scratchpad]

    def _architecture(self) -> str:
        m = self.space.baseline.model
        keys = ["name", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "attention", "vocab_size", "num_experts", "moe_topk", "moe_ffn_hidden_size", "num_shared_experts",
                "first_dense_layers", "mtp_layers"]
        return json.dumps({k: getattr(m, k, None) for k in keys}, default=str)

    def _cluster(self) -> str:
        c = self.space.baseline.cluster
        hw = c.hardware
        return json.dumps({"hardware": hw.name, "vendor": hw.vendor, "num_gpus": c.num_gpus,
                           "gpus_per_node": hw.gpus_per_node, "hbm_gib": round(hw.hbm_capacity_bytes / GIB, 1),
                           "peak_tflops": {k: round(v / 1e12) for k, v in hw.peak_flops_per_s.items()}})

    def _budget_text(self) -> str:
        s = dict(self.context.budget_status()) if self.context else {}
        s.update({"round": self.control.round, "rounds": self.control.rounds,
                  "round_candidates": self.control.in_round, "per_round": self.control.per_round,
                  "trials_since_improvement": self.control.since_improvement})
        return json.dumps(s)

    def _run_round(self) -> None:
        import dspy
        PlanSignature, SearchSignature = _signatures()
        planned: list[dict[str, Any]] = []
        plan_text = ""
        try:
            lm = self._get_lm()
        except Exception as exc:  # no key, no DSPy: no round can do anything
            self._unavailable = f"LLM unavailable: {type(exc).__name__}: {exc}"
            self._event("llm_endpoint_error", self._unavailable)
            return None
        with dspy.context(lm=lm):
            try:
                self.counts["planner_calls"] += 1
                plan = dspy.ChainOfThought(PlanSignature)(
                    architecture=self._architecture(), cluster=self._cluster(),
                    legal_axes=json.dumps(self.space.describe(), default=str),
                    history_summary=json.dumps(self.history.summary(40, sort=True), default=str),
                    extra_guidance=self.extra_guidance or "(none)",
                    scratchpad="\n".join(self.scratchpad) or "(empty)")
                plan_text = f"{plan.rationale}\nHypotheses: {plan.hypotheses}\nPolish: {plan.polish_plan}"
                try:
                    planned = parse_candidates(plan.candidate_configs, self.control.per_round)
                except (ValueError, TypeError) as exc:
                    self._event("llm_malformed", f"planner candidate_configs: {exc}")
            except Exception as exc:
                self._round_failed = True
                self._event(_classify(exc), f"planner: {type(exc).__name__}: {exc}")
                return None
            try:
                self.counts["executor_calls"] += 1
                executor = dspy.ReAct(SearchSignature, tools=self._tools(), max_iters=self._max_iters)
                executor(plan=plan_text, candidate_configs=json.dumps(planned, default=str),
                         budget_status=self._budget_text())
            except Exception as exc:
                self._round_failed = True
                self._event(_classify(exc), f"executor: {type(exc).__name__}: {exc}")
                for values in planned:  # the executor failed: evaluate the plan directly
                    run, problems = self.space.validate(values)
                    if run is not None and self.history.knows(run.key()):
                        continue
                    out = self._propose(values, "planner (executor failed)")
                    if out.get("status") == "STOP":
                        break
        return None
