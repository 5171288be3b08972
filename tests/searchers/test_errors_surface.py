"""Errors are never swallowed: an oracle bug surfaces as a failed trial with its message, once."""
from __future__ import annotations

import oracle.projector
from searchers.evaluator import OracleEvaluator, score_result
from searchers.experiment import load_experiment


def test_a_type_error_inside_the_oracle_is_not_retried_as_an_old_signature(monkeypatch):
    calls = []

    def broken(run, mode="simulate", **kwargs):
        calls.append(kwargs)
        raise TypeError("unsupported operand type(s) for +: 'float' and 'NoneType'")
    monkeypatch.setattr(oracle.projector, "project", broken)
    run = load_experiment("tiny-moe-h100-8").baseline
    res = score_result(OracleEvaluator(), run, run.key())
    assert len(calls) == 1 and calls[0]["memory_tree"] is False
    assert res.status == "failed" and "unsupported operand" in res.reason
