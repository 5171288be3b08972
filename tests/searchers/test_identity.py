"""A configuration is named by its content: editing a custom card changes its key, its space's
fingerprint and the oracle version a ledger records, so a resume refuses rows scored on the old card."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from oracle.model_card import MODEL_DIR
from searchers.driver import run_search
from searchers.evaluator import evaluator_version
from searchers.experiment import Experiment
from searchers.ledger import LedgerError
from searchers.testing import SyntheticEvaluator


class VersionedSynthetic(SyntheticEvaluator):
    """The synthetic oracle with a fixed version, as the real one has (its code fingerprint)."""

    version = "synthetic-v1"


def _experiment(card: Path) -> Experiment:
    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "experiments" / "tiny-moe-h100-8.yaml").read_text())
    data["model"] = str(card)
    data["name"] = "custom-card"
    return Experiment.from_dict(data, name="custom-card")


def _write_card(path: Path, **changes) -> Path:
    card = yaml.safe_load((MODEL_DIR / "tiny-moe.yaml").read_text())
    card.update({"name": "my-moe", **changes})
    path.write_text(yaml.safe_dump(card))
    return path


def test_editing_a_custom_card_changes_the_key_and_the_resume_refuses_the_stale_ledger(tmp_path):
    card = _write_card(tmp_path / "my-card.yaml")
    ledger = tmp_path / "ledger.parquet"
    before = _experiment(card)
    evaluator = VersionedSynthetic(cap_bytes=1e12)
    first = run_search(before, "random", budget=3, seed=0, ledger_path=ledger, evaluator=evaluator)
    assert first.trials == 3
    # same card, same content: the run resumes
    again = run_search(_experiment(card), "random", budget=4, seed=0, ledger_path=ledger, evaluator=evaluator)
    assert again.resumed == 3

    _write_card(card, num_layers=8)  # the user doubles the layers between two runs
    after = _experiment(card)
    assert after.baseline.model.num_layers == 8
    assert after.baseline.key() != before.baseline.key()
    assert after.space.fingerprint != before.space.fingerprint
    assert evaluator_version(evaluator, after.baseline) != evaluator_version(evaluator, before.baseline)
    old, new = evaluator_version(evaluator, before.baseline), evaluator_version(evaluator, after.baseline)
    assert old.startswith("synthetic-v1+") and new.startswith("synthetic-v1+")
    with pytest.raises(LedgerError, match=f"scored by oracle {re.escape(old)}, and this oracle is {re.escape(new)}"):
        run_search(after, "random", budget=5, seed=0, ledger_path=ledger, evaluator=evaluator)


def test_bundled_runs_keep_the_plain_oracle_version(tiny):
    assert evaluator_version(VersionedSynthetic(cap_bytes=1e12), tiny.baseline) == "synthetic-v1"
    assert evaluator_version(SyntheticEvaluator(cap_bytes=1e12), tiny.baseline) is None
