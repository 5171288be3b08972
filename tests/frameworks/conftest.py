"""Tests against the frameworks' own config classes (marker ``frameworks``): skipped, with the reason, where
``.frameworks/`` is missing or does not import (``bash scripts/install-frameworks.sh`` installs it)."""
from __future__ import annotations

import pytest

from tests.frameworks.frameworks import unavailable


@pytest.fixture(scope="session")
def frameworks() -> None:
    """Skip unless the frameworks' config classes can be read here."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
