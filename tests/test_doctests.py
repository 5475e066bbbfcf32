"""Every example in a docstring of the package holds: each module with a ``>>>`` is run through
``doctest`` (found by reading the sources, so a module that gains examples is covered at once)."""

from __future__ import annotations

import doctest
import importlib

import pytest

from tests import PROJECT_ROOT

PACKAGES = ("app", "nlp", "training")
# Modules whose import needs an optional extra: (module, the extra's module).
NEEDS = {"app.spark.job": "pyspark"}


def _modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((PROJECT_ROOT / package).rglob("*.py")):
            if ">>>" in path.read_text(encoding="utf-8"):
                found.append(".".join(path.relative_to(PROJECT_ROOT).with_suffix("").parts))
    return found


def test_doctests_are_found() -> None:
    assert {"nlp.bucketing", "nlp.tokenization", "app.core.settings"} <= set(_modules())


@pytest.mark.parametrize("name", _modules())
def test_doctests_hold(name: str) -> None:
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0 and result.attempted > 0, name
