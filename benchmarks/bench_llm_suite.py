"""The LLM proposer on the search suite, with a real model on an OpenAI-compatible endpoint (issue 14).

    python benchmarks/bench_llm_suite.py --api-base http://127.0.0.1:8765/v1 --model openai/qwen0.5b \
        [--experiments NAME ...] [--budget 30] [--seed 0] [--max-iters 8] [--timeout-s 600] [--json OUT.json]

For every suite experiment (searchers.suite.SUITE, or the named ones) it runs ``seed_llm`` twice on the
same budget and seed, with the LLM proposer and with the offline cross-axis proposer, and prints per
experiment: regret against the cached exhaustive optimum, LLM calls (planner / executor), prompt and
completion tokens (from the endpoint's ``usage``), malformed answers, timeouts and endpoint errors,
and wall time. Nothing here is needed by CI; the model server is the user's (docs/search.md, "The LLM
proposer on the suite"; the recipe for a small local model is in ../shared/NOTES-toolchain.md). The API
key, if any, is read from the environment variable named by ``--api-key-env`` and never printed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from searchers.driver import default_evaluator, exhaustive_optimum, run_search  # noqa: E402
from searchers.llm import LLMSettings  # noqa: E402
from searchers.suite import DEFAULT_OPTIMA_CACHE, suite_experiments  # noqa: E402


def _usage(lm: Any) -> tuple[int, int, int]:
    """(calls, prompt tokens, completion tokens) from a dspy.LM's history (the endpoint's usage)."""
    calls = prompt = completion = 0
    for entry in getattr(lm, "history", []) or []:
        calls += 1
        usage = entry.get("usage") or {}
        prompt += int(usage.get("prompt_tokens") or 0)
        completion += int(usage.get("completion_tokens") or 0)
    return calls, prompt, completion


def _regret(best: float | None, optimum: float | None) -> float | None:
    return None if best is None or not optimum else max(0.0, 1.0 - best / optimum)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--api-base", required=True, help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8765/v1")
    ap.add_argument("--model", required=True, help="LiteLLM model string, e.g. openai/qwen0.5b")
    ap.add_argument("--api-key-env", default=None, help="NAME of the environment variable holding the key")
    ap.add_argument("--experiments", nargs="*", default=None)
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=int, default=600)
    ap.add_argument("--max-tokens", type=int, default=1000)
    ap.add_argument("--prompt-tokens", type=int, default=3000)
    ap.add_argument("--max-iters", type=int, default=8, help="ReAct tool steps per round (the product's default "
                    "is 40; a small local model at ~30 s a call needs fewer to finish a suite in an hour)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    block: dict[str, Any] = {"model": args.model, "api_base": args.api_base, "timeout_s": args.timeout_s,
                             "max_tokens": args.max_tokens, "prompt_tokens": args.prompt_tokens,
                             "max_iters": args.max_iters}
    if args.api_key_env:
        block["api_key_env"] = args.api_key_env
    settings = LLMSettings.from_dict(block)
    rows = []
    for exp in suite_experiments(args.experiments):
        ev = default_evaluator(exp.oracle_mode)
        opt = exhaustive_optimum(exp.space, ev, cache_dir=DEFAULT_OPTIMA_CACHE)["tokens_per_s_per_gpu"]
        base = exp.searcher_options("seed_llm") if exp.searcher == "seed_llm" else {}
        base = {k: v for k, v in base.items() if k not in ("llm", "lm")}
        offline = run_search(exp, "seed_llm", args.budget, args.seed, evaluator=ev, options=base)
        lm = settings.build_lm()
        t0 = time.perf_counter()
        llm = run_search(exp, "seed_llm", args.budget, args.seed, evaluator=ev,
                         options={**base, "llm": settings, "lm": lm})
        wall = time.perf_counter() - t0
        calls, p_tok, c_tok = _usage(lm)
        st = llm.proposer_stats
        row = {"experiment": exp.name, "optimum": opt,
               "llm_regret": _regret(llm.best_tokens_per_s_per_gpu, opt),
               "offline_regret": _regret(offline.best_tokens_per_s_per_gpu, opt),
               "llm_trials": llm.trials, "proposer_trials": llm.proposer_trials, "calls": calls,
               "planner_calls": st.get("planner_calls"), "executor_calls": st.get("executor_calls"),
               "prompt_tokens": p_tok, "completion_tokens": c_tok, "malformed": st.get("llm_malformed"),
               "timeouts": st.get("llm_timeout"), "endpoint_errors": st.get("llm_endpoint_error"),
               "illegal": st.get("illegal"), "junk": st.get("junk"), "rounds": st.get("rounds"),
               "failed_rounds": st.get("failed_rounds"), "wall_s": wall, "offline_wall_s": offline.wall_s}
        rows.append(row)
        pct = (lambda v: "-" if v is None else f"{100 * v:.1f}%")
        print(f"{exp.name:30s} regret llm {pct(row['llm_regret']):>6} offline {pct(row['offline_regret']):>6}  "
              f"calls {calls} (planner {row['planner_calls']}, executor {row['executor_calls']})  tokens "
              f"{p_tok:,}+{c_tok:,}  malformed {row['malformed']} timeouts {row['timeouts']} "
              f"errors {row['endpoint_errors']}  wall {wall:.0f} s (offline {offline.wall_s:.1f} s)", flush=True)
        if args.json:  # after every experiment: a long run stopped early keeps what finished
            Path(args.json).write_text(json.dumps({"model": args.model, "budget": args.budget, "seed": args.seed,
                                                   "max_iters": args.max_iters, "experiments": rows}, indent=1,
                                                  default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
