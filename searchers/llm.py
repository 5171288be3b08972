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
rounds; a round stops when the incumbent has not improved for ``patience`` (5) trials, after
``patience`` proposals in a row that cost nothing (illegal, repeats, junk), or when the budget is
spent; the tool loop then ends at once (no further LLM call that round).

Real small models answer badly (``../shared/llm-recordings``): the legal-axes list copied into
``candidate_configs``, ``[{}, {}, {}]``, ``evaluate({"config": {"axis": [...]}})``, bullet lists for
JSON lists, fences and truncated JSON. Answers are read leniently where the meaning is clear
(:func:`parse_json` with ``json_repair``, :func:`parse_list`, :func:`unwrap_proposal`); what names no
configuration is junk, recorded and never sent to the oracle.

Failure never shortens the search. Malformed answers, illegal axes, timeouts and endpoint errors are
written to the ledger (``llm_malformed`` / ``illegal`` / ``llm_timeout`` / ``llm_endpoint_error`` /
``llm_round_failed`` rows). A round that scores no trial is a failed round, whatever the model
answered; when the executor scores nothing the planner's candidates are evaluated directly; after
two failed rounds in a row, or when the LLM's rounds are over with budget left, the offline
cross-axis proposer spends the rest of the budget (the label then says so, and every ledger row
names the proposer that produced it).

Prompts stay within ``prompt_tokens`` (default :data:`PROMPT_TOKENS`, estimated at
:data:`CHARS_PER_TOKEN`): the planner sees fewer history rows and the executor its latest tool steps
until the prompt fits, so a 4k-token context window holds every call.

The model is any LiteLLM model string with ``api_base``; the API key is read from the environment
variable named by ``api_key_env`` when the LM is built, registered with the ledger's scrubber, and
never logged or stored.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from oracle.config import TrainingConfig
from oracle.errors import InvalidConfigError, clip
from oracle.schema import unknown_key_problems
from oracle.units import GIB
from searchers.base import Candidate, SearchContext, TrialResult
from searchers.crossaxis import RoundControl
from searchers.history import History
from searchers.ledger import forget_secret, register_secret, scrub
from searchers.space import SearchSpace

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _env_default(name: str, value: str) -> Iterator[None]:
    """``os.environ.setdefault(name, value)`` for the block only (the caller's environment is put back)."""
    had = name in os.environ
    os.environ.setdefault(name, value)
    try:
        yield
    finally:
        if not had:
            os.environ.pop(name, None)


def _dspy() -> Any:
    """``dspy`` (and with it LiteLLM), imported with LiteLLM's own fetches off: at import LiteLLM downloads its
    model-cost map from GitHub unless ``LITELLM_LOCAL_MODEL_COST_MAP`` or ``LITELLM_OFFLINE_MODE`` is set, and a run
    may reach no network but the user's own endpoint. The caller's environment is put back (a value the user set
    stands). Every import of dspy in this module goes through here: the first one decides. LiteLLM is imported here
    too: dspy imports it only when an LM first runs, which would be outside this block. Once both are imported the
    environment is not touched again (prompt sizing calls this per estimate; other threads read the environment)."""
    if "dspy" in sys.modules and "litellm" in sys.modules:
        return sys.modules["dspy"]
    with _env_default("LITELLM_LOCAL_MODEL_COST_MAP", "True"), _env_default("LITELLM_OFFLINE_MODE", "true"):
        import dspy
        import litellm  # noqa: F401
    return dspy


_LLM_KEYS = ["model", "api_base", "api_key_env", "timeout_s", "max_tokens", "temperature", "engine",
             "num_retries", "max_iters", "prompt_tokens"]
CHARS_PER_TOKEN = 3.0
"""Characters per prompt token used to estimate prompt sizes: measured 3.0 on the planner prompts and
3.8-4.3 on the executor prompts of ../shared/llm-recordings (Qwen2.5 tokenizer); JSON-heavy text is
the densest, so 3.0 bounds both."""
MIN_TRAJECTORY_CHARS = 1500
"""Room the executor's prompt keeps for its latest tool steps (about two steps with their observations)."""
PROMPT_TOKENS = 3000
"""Default prompt budget (estimated tokens, system prompt included): a 4,096-token context keeps
~1,000 tokens for the answer (set max_tokens to match)."""


ENGINES = ("litellm", "auto", "lm15")
"""The DSPy engines an LM is built with (``dspy.LM(..., engine=)``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMSettings:
    """The experiment's ``llm`` block."""

    model: str
    """Any LiteLLM model string, e.g. 'openai/gpt-4o' or 'anthropic/claude-sonnet-4-6'."""
    api_base: str | None = None
    """OpenAI-compatible endpoint (a LiteLLM gateway, a local server)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (the key itself is never in a file). Without it, a
    server on this machine (``api_base`` on 127.0.0.1, localhost or ::1: llama.cpp, vLLM, Ollama, SGLang) whose
    provider finds no key in the environment is sent the placeholder :data:`LOCAL_NO_KEY`: such servers take no
    key, and LiteLLM's OpenAI client refuses to call without one ('Missing credentials'). A key the environment
    holds (OPENAI_API_KEY for a local gateway) is left to LiteLLM, as before."""
    timeout_s: float = 300.0
    """Per-call timeout (paper: 300 s)."""
    max_tokens: int = 8000
    """Completion limit per call (paper: 8000)."""
    temperature: float | None = None
    """Sampling temperature (None = the provider's default, as in the paper)."""
    engine: str = "litellm"
    """DSPy engine: one of :data:`ENGINES`: 'litellm' (any LiteLLM model string), 'auto' or 'lm15' (DSPy's own
    client)."""
    num_retries: int = 0
    """Retries on transient errors (each retry can take up to timeout_s)."""
    max_iters: int = 40
    """ReAct tool steps per round."""
    prompt_tokens: int = PROMPT_TOKENS
    """Budget for every prompt (estimated at CHARS_PER_TOKEN): the planner sees fewer history rows
    and a clipped scratchpad, the executor the most recent tool steps, until the prompt fits."""

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
        for k, what in (("api_base", "an endpoint URL such as 'http://127.0.0.1:8000/v1'"),
                        ("api_key_env", "the NAME of an environment variable holding the key")):
            if data.get(k) is not None and not (isinstance(data[k], str) and data[k].strip()):
                problems.append(f"{where}.{k}={clip(repr(data[k]), 60)} must be {what}")
        if data.get("engine") is not None and data["engine"] not in ENGINES:
            problems.append(f"{where}.engine={clip(repr(data['engine']), 60)} must be one of {' | '.join(ENGINES)}")
        t = data.get("temperature")
        if t is not None and not (isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < float("inf")):
            problems.append(f"{where}.temperature={clip(repr(t), 60)} must be a number >= 0 (or left out: the "
                            f"provider's default)")
        for k in ("timeout_s",):
            if k in data and not (isinstance(data[k], (int, float)) and data[k] > 0):
                problems.append(f"{where}.{k}={data[k]!r} must be a positive number")
        for k in ("max_tokens", "max_iters"):
            if k in data and not (isinstance(data[k], int) and data[k] > 0):
                problems.append(f"{where}.{k}={data[k]!r} must be a positive integer")
        if "prompt_tokens" in data and not (isinstance(data["prompt_tokens"], int)
                                            and not isinstance(data["prompt_tokens"], bool)
                                            and data["prompt_tokens"] >= 1000):
            problems.append(f"{where}.prompt_tokens={data['prompt_tokens']!r} must be an integer >= 1000 "
                            f"(the fixed part of a prompt alone is ~1,000 tokens)")
        if "num_retries" in data and not (isinstance(data["num_retries"], int) and data["num_retries"] >= 0):
            problems.append(f"{where}.num_retries={data['num_retries']!r} must be an integer >= 0")
        if problems:
            raise InvalidConfigError(problems)
        return cls(**{k: data[k] for k in _LLM_KEYS if k in data})

    def build_lm(self) -> Any:
        """A ``dspy.LM`` for these settings (reads the key from the environment; no response cache)."""
        dspy = _dspy()
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
        elif is_loopback(self.api_base) and not _provider_key_set(self.model, self.api_base):
            kwargs["api_key"] = LOCAL_NO_KEY
        return dspy.LM(self.model, engine=self.engine, **kwargs)


LOCAL_NO_KEY = "no-key-local-server"
"""The API key sent to a keyless server on this machine (:attr:`LLMSettings.api_key_env` unset): not a secret."""


def is_loopback(api_base: str | None) -> bool:
    """``api_base`` names a server on this machine (127.0.0.0/8, localhost, ::1)."""
    if not isinstance(api_base, str) or not api_base:
        return False
    from urllib.parse import urlsplit
    try:
        host = (urlsplit(api_base if "//" in api_base else f"//{api_base}").hostname or "").lower()
    except ValueError:  # a malformed URL (an unclosed IPv6 bracket): not a local server
        return False
    return host in ("localhost", "::1") or host.startswith("127.")


def _provider_key_set(model: str, api_base: str | None) -> bool:
    """The model's provider finds its key in the environment (LiteLLM's ``validate_environment``: OPENAI_API_KEY for
    an ``openai/`` model; a provider that needs none counts as set), so no placeholder replaces it."""
    try:
        import litellm  # imported with dspy by _dspy() (no network)
        return bool(litellm.validate_environment(model=model, api_base=api_base).get("keys_in_environment"))
    except Exception:  # a model string LiteLLM cannot map: OpenAI's variable decides, as its client would read it
        return bool(os.environ.get("OPENAI_API_KEY"))


class LLMUnavailable(RuntimeError):
    """The LLM cannot be used at all (no key, no DSPy); the offline proposer runs instead."""


def llm_label(settings: Any, lm: Any = None) -> str:
    if settings is not None:
        model = settings.model if isinstance(settings, LLMSettings) else dict(settings).get("model", "?")
        return f"llm:{model}"
    return f"llm:{getattr(lm, 'model', type(lm).__name__)}"


# ---------------------------------------------------------------------------------------------- DSPy
def _signatures() -> tuple[Any, Any]:
    dspy = _dspy()

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
        hypotheses: str = dspy.OutputField(desc="at most 5 testable hypotheses, one a line")
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


# ---------------------------------------------------------------------------------------------- parsing
_FENCE = re.compile(r"```[a-zA-Z]*\s*(.*?)(?:```|$)", re.S)
_BULLET = re.compile(r"^\s*(?:[-*+\u2022]|\d+[.)])\s+")
_WRAPPERS = ("config", "configuration", "candidate", "values", "training", "changes")
"""Single-key objects a model wraps a proposal in: ``{"config": {...}}`` means ``{...}``."""
_LISTS = ("candidates", "candidate_configs", "configs", "configurations")


def parse_json(text: Any) -> Any:
    """JSON from an LLM answer, read leniently where the meaning is clear.

    A dict/list passes as is. Text may be wrapped in ``` fences, carry prose around the JSON, use
    Python literals (single quotes, True/False), miss closing brackets, or list one object per
    markdown bullet: ``json.loads`` first, then ``json_repair`` (a library built for LLM output) on
    the text from the first bracket on. ValueError when nothing JSON-like is there.
    """
    if isinstance(text, (dict, list)):
        return text
    if not isinstance(text, str):
        raise ValueError(f"expected JSON text, got {type(text).__name__}")
    s = text.strip()
    m = _FENCE.search(s)
    if m and m.group(1).strip():
        s = m.group(1).strip()
    try:
        return json.loads(s)
    except (ValueError, RecursionError):
        pass
    starts = [i for i in (s.find("["), s.find("{")) if i >= 0]
    if not starts:
        raise ValueError(f"no JSON object or list in {_clip(text)!r}")
    import json_repair
    try:
        data = json_repair.loads(s[min(starts):])
    except (ValueError, RecursionError, IndexError, TypeError) as exc:
        raise ValueError(f"unreadable JSON in {_clip(text)!r}: {exc}") from None
    if not isinstance(data, (dict, list)):
        raise ValueError(f"no JSON object or list in {_clip(text)!r}")
    return data


def parse_list(text: Any) -> list[str]:
    """A list of short texts: a JSON list, or one item a line (markdown bullets or numbers stripped)."""
    if isinstance(text, (list, tuple)):
        return [str(t).strip() for t in text if str(t).strip()]
    s = str(text or "").strip()
    if s.startswith("["):
        try:
            data = parse_json(s)
            if isinstance(data, list):
                return [str(t).strip() for t in data if str(t).strip()]
        except ValueError:
            pass
    return [_BULLET.sub("", line).strip() for line in s.splitlines() if _BULLET.sub("", line).strip()]


LIST_AXES = frozenset(k for k, hint in typing.get_type_hints(TrainingConfig).items() if "tuple[" in str(hint))
"""Training keys whose one value is a list of names (cuda_graph_scope, recompute_modules, offload_modules): a JSON
list is their value, not the legal values copied back."""


def unwrap_proposal(values: Any) -> tuple[dict[str, Any] | None, str]:
    """One proposal as a flat mapping of axis values, or (None, why it is junk).

    ``{"config": {...}}`` (and the other one-key wrappers) are unwrapped; an axis given a list or an
    object (the legal-axes list copied back) and an empty object are junk: they name no configuration, except a list
    of names for a key whose value is one (:data:`LIST_AXES`, e.g. ``cuda_graph_scope: [attn, moe_router]``).
    """
    for _ in range(4):
        if isinstance(values, Mapping) and len(values) == 1:
            (k, v), = values.items()
            if str(k).lower() in _WRAPPERS and isinstance(v, Mapping):
                values = v
                continue
        break
    if not isinstance(values, Mapping):
        return None, f"a proposal must be a JSON object of axis values, got {type(values).__name__}"
    if not values:
        return None, "an empty object names no configuration"
    nested = [str(k) for k, v in values.items() if isinstance(v, (dict, Mapping)) or (
        isinstance(v, (list, tuple)) and (k not in LIST_AXES or not all(isinstance(x, str) for x in v)))]
    if nested:
        return None, (f"each axis takes one value; {', '.join(nested[:4])} got a list or an object "
                      f"(the legal values copied back?)")
    return {str(k): v for k, v in values.items()}, ""


def parse_candidates(text: Any, limit: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The planner's candidates (at most ``limit``) and why the others were dropped.

    Accepts a JSON list (fenced, repaired, or one object per bullet), a single object, or a list under
    ``candidates``; unwraps ``{"config": {...}}``; drops junk (see :func:`unwrap_proposal`) and
    duplicates. ValueError when the text holds no JSON at all.
    """
    data = parse_json(text)
    if isinstance(data, Mapping):
        lists = [data[k] for k in _LISTS if isinstance(data.get(k), list)]
        data = lists[0] if lists else [data]
    out: list[dict[str, Any]] = []
    junk: list[str] = []
    seen: set[str] = set()
    for i, item in enumerate(data):
        values, why = unwrap_proposal(item)
        if values is None:
            junk.append(f"candidate {i}: {why}")
            continue
        sig = json.dumps(values, sort_keys=True, default=str)
        if sig not in seen and len(out) < limit:
            seen.add(sig)
            out.append(values)
    return out, junk


def _clip(text: Any, n: int = 120) -> str:
    s = str(text)
    return s if len(s) <= n else s[:n] + "..."


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


class _RoundOver(BaseException):
    """Raised by the evaluate tool when the round is over: a BaseException, so DSPy's ReAct (which turns
    tool exceptions into observations) lets it end the tool loop instead of asking the LLM again."""


def _exit_exception() -> type[BaseException]:
    from greenlet import GreenletExit
    return GreenletExit


def _compact(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), default=str)


def _history_rows(history: History, k: int, reason_chars: int = 200) -> list[dict[str, Any]]:
    """The planner's view of the history: best first, None fields and empty reasons left out, reasons
    clipped to ``reason_chars``."""
    rows = history.summary(k, sort=True) if k > 0 else []
    out = []
    for r in rows:
        r = {f: v for f, v in r.items() if v not in (None, "")}
        if "reason" in r:
            r["reason"] = _clip(r["reason"], reason_chars)
        out.append(r)
    return out


def prompt_chars(signature: Any, inputs: Mapping[str, Any]) -> int:
    """Characters of the chat prompt DSPy's ChatAdapter builds for ``signature`` and ``inputs``."""
    dspy = _dspy()
    try:
        msgs = dspy.ChatAdapter().format(signature, demos=[], inputs=dict(inputs))
        return sum(len(str(m.get("content", ""))) for m in msgs)
    except Exception:  # an adapter change must not stop a search: estimate from the parts
        return len(getattr(signature, "instructions", "")) + sum(len(str(v)) for v in inputs.values()) + 2000


def _bounded_react(signature: Any, tools: list[Any], max_iters: int) -> Any:
    """``dspy.ReAct`` whose trajectory keeps only the latest tool steps that fit ``trajectory_chars``."""
    dspy = _dspy()

    class BoundedReAct(dspy.ReAct):
        trajectory_chars = 10**9

        def _format_trajectory(self, trajectory: dict[str, Any]) -> str:
            steps = dict(trajectory)
            text = super()._format_trajectory(steps)
            while len(text) > self.trajectory_chars and len(steps) > 4:
                for key in list(steps)[:4]:  # thought, tool name, tool args, observation of the oldest step
                    steps.pop(key)
                text = super()._format_trajectory(steps)
            if len(text) > self.trajectory_chars:
                text = "..." + text[len(text) - max(0, self.trajectory_chars - 3):]
            return text

    return BoundedReAct(signature, tools=tools, max_iters=max_iters)


class LLMProposer:
    """Planner + ReAct executor over a shared :class:`History` (see module doc)."""

    def __init__(self, space: SearchSpace, history: History, *, settings: Any = None, lm: Any = None,
                 extra_guidance: str = "", context: SearchContext | None = None, rounds: int = 4,
                 per_round: int = 25, patience: int = 5, offline: str = "guided") -> None:
        self.space, self.history = space, history
        self.offline = offline
        """The offline proposer that finishes the budget when the LLM cannot (``seed_llm``'s ``offline``)."""
        self.settings = LLMSettings.from_dict(settings) if settings is not None else None
        self._lm = lm
        self.extra_guidance = extra_guidance
        self.context = context
        self.control = RoundControl(rounds=rounds, per_round=per_round, patience=patience)
        self.base_label = llm_label(self.settings, lm)
        self.label = self.base_label
        self.counts = {"rounds": 0, "failed_rounds": 0, "planner_calls": 0, "executor_calls": 0,
                       "proposals": 0, "scored": 0, "illegal": 0, "repeats": 0, "junk": 0,
                       "llm_malformed": 0, "llm_timeout": 0, "llm_endpoint_error": 0}
        self.scratchpad: list[str] = []
        self.prompt_tokens = self.settings.prompt_tokens if self.settings else PROMPT_TOKENS
        self.max_prompt_chars = 0
        """Longest prompt sent so far (characters, as measured before the call)."""
        self._gr: Any = None
        self._result: TrialResult | None = None
        self._failed_rounds = 0
        self._fallback: Any = None
        self._round_failed = False
        self._round_scored = 0
        self._idle_in_row = 0
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
            self._lm = self.settings.build_lm()  # registers the API key with the scrubber
            self._secret = os.environ.get(self.settings.api_key_env) if self.settings.api_key_env else None
        return self._lm

    def _budget_left(self) -> int:
        return int(self.context.budget_status()["remaining"]) if self.context is not None else 0

    def _switch_to_fallback(self, why: str) -> None:
        """The offline proposer finishes the budget (the round-based one given rounds enough to spend it)."""
        from searchers.offline import offline_proposer
        # the breakdown-guided proposer needs a scored trial with a time breakdown; without one the round-based
        # proposer finishes the budget (as seed_llm does offline)
        kind = self.offline if any(e.result.breakdown for e in self.history.ok()) else "rounds"
        # with the search context, as the offline proposer has it: its free memory probes and layout
        # jumps need it (without it the fallback searched blind: docs/search.md, the LLM proposer on the suite)
        self._fallback = offline_proposer(kind, self.space, self.history, self.context,
                                          rounds=max(1, self._budget_left()), per_round=self.control.per_round,
                                          patience=self.control.patience)
        self.label = f"{self.base_label} -> {self._fallback.label} fallback"
        self._event("llm_fallback", why)

    def _end_round(self) -> None:
        """A round that scored no trial is a failed round, whatever the LLM answered."""
        self._gr = None
        if self._round_scored > 0:
            self._failed_rounds = 0
            return
        self._failed_rounds += 1
        self.counts["failed_rounds"] += 1
        if not self._round_failed:  # no error explained it: the answers were junk, illegal or repeats
            self._event("llm_round_failed", f"round {self.control.round} scored no trial "
                                            f"({self.control.in_round} proposals: illegal, repeats or junk)")

    # ------------------------------------------------------------------ ask / tell
    def suggest(self) -> Candidate | None:
        from greenlet import greenlet
        while True:
            if self._fallback is not None:
                return self._fallback.suggest()
            if self._gr is None or self._gr.dead:
                if self._gr is not None:
                    self._end_round()
                if self._unavailable:
                    self._switch_to_fallback(self._unavailable)
                    continue
                if self._failed_rounds >= 2:
                    self._switch_to_fallback("two LLM rounds in a row scored no trial")
                    continue
                if not self.control.start_round(self.history.best_value()):
                    if self._budget_left() > 0:
                        self._switch_to_fallback(f"the LLM's {self.control.rounds} rounds are over with "
                                                 f"{self._budget_left()} trials of the budget left")
                        continue
                    return None
                self.counts["rounds"] += 1
                self._round_failed, self._round_scored, self._idle_in_row = False, 0, 0
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
        elif not counted:
            self.counts["repeats"] += 1
        self._idle_in_row = 0 if counted else self._idle_in_row + 1
        if result.status == "ok" and counted:
            self._round_scored += 1
            self.counts["scored"] += 1

    def close(self) -> None:
        if self._gr is not None and not self._gr.dead:
            self._gr.throw(_exit_exception()())  # unwinds the tool loop (a BaseException: ReAct won't catch it)
        self._gr = None
        forget_secret(getattr(self, "_secret", None))
        self._secret = None

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "max_prompt_tokens_estimated": round(self.max_prompt_chars / CHARS_PER_TOKEN),
                "prompt_tokens_budget": self.prompt_tokens}

    # ------------------------------------------------------------------ inside the greenlet
    def _stop_reason(self) -> str:
        if self.control.round_over():
            return ("round over: candidate limit reached or no improvement in the last "
                    f"{self.control.patience} trials")
        if self._idle_in_row >= self.control.patience:
            return f"round over: the last {self._idle_in_row} proposals were illegal, repeats or junk"
        if self.context is not None and self.context.budget_status()["remaining"] <= 0:
            return "trial budget spent"
        return ""

    def _propose(self, raw: Any, note: str, *, direct: bool = False) -> dict[str, Any]:
        """Hand one proposal to the driver and return what became of it (runs in the greenlet).

        Junk (unreadable JSON, an empty object, lists of values) never reaches the driver but counts
        against the round like an illegal proposal, so a model that only writes junk ends its round.
        ``direct`` (the planner's own candidates) is bounded by the budget only."""
        stop = self._stop_reason() if not direct else (
            "trial budget spent" if self.context is not None and self.context.budget_status()["remaining"] <= 0
            else "")
        if stop:
            return {"status": "STOP", "reason": stop}
        self.control.proposed()
        try:
            values, why = unwrap_proposal(parse_json(raw))
        except ValueError as exc:
            values, why = None, f"malformed JSON: {exc}"
        if values is None:
            self._idle_in_row += 1
            self.counts["junk"] += 1
            self._event("llm_malformed", f"{note}: {why}")
            return {"status": "error", "reason": why}
        self.counts["proposals"] += 1
        cand = Candidate(values=values, phase="llm", round=self.control.round, proposer=self.base_label,
                         note=note[:200])
        result = self._gr.parent.switch(cand)
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

        def evaluate(config: Any = None, **axes: Any) -> str:
            """Project throughput and memory of one configuration: config is a JSON object of axis values
            (one value per axis; omitted axes keep the baseline). Costs one trial unless illegal or known."""
            out = prop._propose(config if config is not None else axes, "executor")
            if out["status"] == "STOP":
                raise _RoundOver(out["reason"])  # ends the tool loop: no more LLM calls this round
            return _compact(out)

        def evaluate_memory_only(config: Any = None, **axes: Any) -> str:
            """Project only the memory of a configuration (free: no trial is spent)."""
            try:
                values, why = unwrap_proposal(parse_json(config if config is not None else axes))
            except ValueError as exc:
                values, why = None, f"malformed JSON: {exc}"
            if values is None:
                prop._idle_in_row += 1  # junk, even free, ends the round after `patience` in a row
                if prop._idle_in_row >= prop.control.patience:
                    raise _RoundOver(f"the last {prop._idle_in_row} proposals were junk")
                return _compact({"status": "error", "reason": why})
            if prop.context is None:
                return _compact({"status": "error", "reason": "memory projection unavailable"})
            return _compact(prop.context.memory_only(values))

        def get_history(k: int = 10) -> str:
            """The best k trials (at most 10): changes versus the baseline, throughput, memory, status."""
            try:
                n = max(1, min(10, int(k)))
            except (TypeError, ValueError, OverflowError):
                n = 10
            return _compact(_history_rows(prop.history, n))

        def get_best() -> str:
            """The best configuration so far and its projected tokens/s/GPU."""
            b = prop.history.best()
            return _compact({"config": b.point, "tokens_per_s_per_gpu": round(b.result.value, 1)}
                            if b else {"config": None})

        def get_legal_axes() -> str:
            """The searched axes with their allowed values, the fixed values and the baseline."""
            return _compact(prop.space.describe())

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
            prop.scratchpad.append(str(text)[:500])
            return "noted"

        def read_scratchpad() -> str:
            """Everything noted so far."""
            return prop._scratchpad_text() or "(empty)"

        return [evaluate, evaluate_memory_only, get_history, get_best, get_legal_axes, get_architecture,
                get_cluster, get_budget_status, note_to_scratchpad, read_scratchpad]

    def _scratchpad_text(self, limit: int = 1500) -> str:
        """The latest notes that fit ``limit`` characters."""
        out: list[str] = []
        size = 0
        for note in reversed(self.scratchpad):
            if size + len(note) + 1 > limit:
                break
            out.append(note)
            size += len(note) + 1
        return "\n".join(reversed(out))

    def _architecture(self) -> str:
        m = self.space.baseline.model
        keys = ["name", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "attention", "vocab_size", "num_experts", "moe_topk", "moe_ffn_hidden_size", "num_shared_experts",
                "first_dense_layers", "mtp_layers"]
        return _compact({k: v for k in keys if (v := getattr(m, k, None)) is not None})

    def _cluster(self) -> str:
        c = self.space.baseline.cluster
        hw = c.hardware
        return _compact({"hardware": hw.name, "vendor": hw.vendor, "num_gpus": c.num_gpus,
                         "gpus_per_node": hw.gpus_per_node, "hbm_gib": round(hw.hbm_capacity_bytes / GIB, 1),
                         "peak_tflops": {k: round(v / 1e12) for k, v in hw.peak_flops_per_s.items()}})

    def _budget_text(self) -> str:
        s = dict(self.context.budget_status()) if self.context else {}
        s.update({"round": self.control.round, "rounds": self.control.rounds,
                  "round_candidates": self.control.in_round, "per_round": self.control.per_round,
                  "trials_since_improvement": self.control.since_improvement})
        return _compact(s)

    # ------------------------------------------------------------------ prompts within the budget
    def _plan_inputs(self, signature: Any) -> dict[str, str]:
        """Planner inputs that fit ``prompt_tokens``: shorter reasons and fewer history rows (the best are
        kept), then shorter notes."""
        budget = int(self.prompt_tokens * CHARS_PER_TOKEN)
        inputs = {"architecture": self._architecture(), "cluster": self._cluster(),
                  "legal_axes": _compact(self.space.describe()), "history_summary": "[]",
                  "extra_guidance": _clip(self.extra_guidance or "(none)", 1000),
                  "scratchpad": self._scratchpad_text(800) or "(empty)"}
        for k, reason_chars in ((40, 200), (30, 120), (20, 80), (14, 60), (10, 60), (7, 40), (5, 40), (3, 40),
                                (1, 40), (0, 0)):
            inputs["history_summary"] = _compact(_history_rows(self.history, k, reason_chars))
            size = prompt_chars(signature, inputs)
            if size <= budget:
                break
        if size > budget:
            inputs["extra_guidance"] = _clip(inputs["extra_guidance"], 300)
            inputs["scratchpad"] = self._scratchpad_text(300) or "(empty)"
            size = prompt_chars(signature, inputs)
        self.max_prompt_chars = max(self.max_prompt_chars, size)
        return inputs

    def _executor(self, signature: Any, plan_text: str,
                  planned: list[dict[str, Any]]) -> tuple[Any, dict[str, str]]:
        """The ReAct executor and its inputs; the trajectory gets what the budget leaves after the fixed
        prompt, at least MIN_TRAJECTORY_CHARS (a shorter plan and fewer listed candidates first)."""
        executor = _bounded_react(signature, self._tools(), self._max_iters)
        budget = int(self.prompt_tokens * CHARS_PER_TOKEN)
        for plan_chars, n in ((1500, len(planned)), (800, 12), (400, 6), (200, 3), (100, 1)):
            inputs = {"plan": _clip(plan_text, plan_chars), "candidate_configs": _compact(planned[:n]),
                      "budget_status": self._budget_text()}
            fixed = max(prompt_chars(executor.react.signature, {**inputs, "trajectory": ""}),
                        prompt_chars(executor.extract.predict.signature, {**inputs, "trajectory": ""}))
            if budget - fixed >= MIN_TRAJECTORY_CHARS:
                break
        executor.trajectory_chars = max(0, budget - fixed)
        self.max_prompt_chars = max(self.max_prompt_chars, fixed + executor.trajectory_chars)
        return executor, inputs

    # ------------------------------------------------------------------ one round (in the greenlet)
    def _run_round(self) -> None:
        dspy = _dspy()
        PlanSignature, SearchSignature = _signatures()
        planned: list[dict[str, Any]] = []
        plan_text = ""
        try:
            lm = self._get_lm()
        except Exception as exc:  # no key, no DSPy: no round can do anything
            self._unavailable = f"LLM unavailable: {type(exc).__name__}: {exc}"
            self._round_failed = True
            self._event("llm_endpoint_error", self._unavailable)
            return None
        with dspy.context(lm=lm):
            try:
                self.counts["planner_calls"] += 1
                planner = dspy.ChainOfThought(PlanSignature)
                plan = planner(**self._plan_inputs(planner.predict.signature))
                hypotheses = parse_list(plan.hypotheses)[:5]
                plan_text = _clip(f"{plan.rationale}\nHypotheses:\n" + "\n".join(f"- {h}" for h in hypotheses)
                                  + f"\nPolish: {plan.polish_plan}", 1500)
                try:
                    planned, junk = parse_candidates(plan.candidate_configs, self.control.per_round)
                    if junk:
                        self.counts["junk"] += len(junk)
                        self._event("llm_malformed", f"planner candidate_configs: {len(junk)} dropped, e.g. "
                                                     f"{junk[0]}")
                    elif not planned:
                        self._event("llm_malformed", "planner candidate_configs: no configuration in "
                                                     f"{_clip(plan.candidate_configs)!r}")
                except ValueError as exc:
                    self._event("llm_malformed", f"planner candidate_configs: {exc}")
            except Exception as exc:
                self._round_failed = True
                self._event(_classify(exc), f"planner: {type(exc).__name__}: {exc}")
                return None
            try:
                self.counts["executor_calls"] += 1
                executor, inputs = self._executor(SearchSignature, plan_text, planned)
                executor(**inputs)
            except _RoundOver:
                pass
            except Exception as exc:
                self._round_failed = True
                self._event(_classify(exc), f"executor: {type(exc).__name__}: {exc}")
            if self._round_scored == 0 and planned:
                # the executor scored nothing: evaluate the planner's own candidates directly
                for values in planned:
                    run, problems = self.space.validate(values)
                    if run is not None and not problems and self.history.knows(run.key()):
                        continue
                    if self._propose(values, "planner (executor scored none)", direct=True)["status"] == "STOP":
                        break
        return None
