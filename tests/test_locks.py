"""The pins: ``pyproject.toml`` says what is needed, ``make lock`` writes the locks from it.

The locks are generated (uv, for Python 3.11 to 3.13 at once); these checks catch a lock edited by
hand or left behind after a pin changed in ``pyproject.toml`` (run ``make lock``).
"""

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
EXTRAS = PROJECT["optional-dependencies"]
EXTRA_LOCKS = [f"requirements-{extra}.lock" for extra in EXTRAS]  # dev's holds training's too


def pins(lock: str) -> dict[str, str]:
    """``{name: version}`` of a lock (markers dropped; each package is pinned once)."""
    found: dict[str, str] = {}
    for line in (ROOT / lock).read_text(encoding="utf-8").splitlines():
        line = line.partition("#")[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            found[canonicalize_name(req.name)] = spec.version
    return found


def declared(names: list[str]) -> dict[str, str]:
    return {
        canonicalize_name(r.name): next(iter(r.specifier)).version for r in map(Requirement, names)
    }


def test_locks_serving_lock_pins_the_dependencies_and_no_development_tool():
    serving = pins("requirements.lock")
    assert declared(PROJECT["dependencies"]).items() <= serving.items()
    for extra in ("dev", "training"):
        assert not set(declared(EXTRAS[extra])) & set(serving), extra


@pytest.mark.parametrize("lock", EXTRA_LOCKS)
def test_locks_each_extra_lock_is_serving_plus_the_extra_at_the_dev_versions(lock):
    extra = lock.removeprefix("requirements-").removesuffix(".lock")
    found, dev = pins(lock), pins("requirements-dev.lock")
    assert pins("requirements.lock").items() <= found.items()
    assert declared(EXTRAS[extra]).items() <= found.items()
    if extra == "dev":
        assert declared(EXTRAS["training"]).items() <= found.items()
    assert {n: v for n, v in found.items() if dev.get(n, v) != v} == {}  # installs on top of dev


def test_locks_are_exactly_one_per_extra_and_the_serving_one():
    on_disk = sorted(p.name for p in ROOT.glob("requirements*.lock"))
    assert on_disk == sorted(["requirements.lock", *EXTRA_LOCKS])
