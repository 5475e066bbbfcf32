"""deploy/image/serving_pins.py: the image installs the serving dependencies, each at its locked version."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "serving_pins", ROOT / "deploy" / "image" / "serving_pins.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


pins = _module()
LOCK = pins.read_lock("tensorflow==2.21.0\ntf-keras==2.21.0\nflask==3.1.3\npytest==9.2.0\n")


def test_serving_pins_swap_tensorflow_and_keep_tools_out() -> None:
    serving, constraints, nodeps = pins.serving_pins(
        ["tensorflow==2.21.0", "tf_keras==2.21.0", "Flask==3.1.3"], LOCK, "tensorflow-cpu"
    )
    assert serving == ["tensorflow-cpu==2.21.0", "flask==3.1.3"]
    assert nodeps == ["tf-keras==2.21.0", "bert4keras==0.11.5"]
    assert "pytest==9.2.0" in constraints  # a constraint only: nothing installs it
    assert not any(c.startswith(("tensorflow==", "tf-keras==")) for c in constraints)


@pytest.mark.parametrize(
    ("dependencies", "tensorflow", "message"),
    [
        (
            ["tensorflow", "tf-keras", "gunicorn"],
            "tensorflow-cpu",
            "not pinned in the lock: gunicorn",
        ),
        (["tensorflow", "tf-keras"], "tensorflow-gpu", "TENSORFLOW must be one of"),
        (["flask"], "tensorflow-cpu", "no tensorflow or no tf-keras"),
    ],
)
def test_serving_pins_refuse_what_they_cannot_pin(
    dependencies: list[str], tensorflow: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        pins.serving_pins(dependencies, LOCK, tensorflow)


def test_serving_pins_cover_the_projects_dependencies(tmp_path: Path) -> None:
    assert (
        pins.main(
            [
                str(ROOT / "pyproject.toml"),
                str(ROOT / "requirements.lock"),
                "tensorflow-cpu",
                str(tmp_path),
            ]
        )
        == 0
    )
    serving = (tmp_path / "serving.txt").read_text().split()
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    # One line per declared dependency (more where a universal lock pins one per Python), with
    # tensorflow as tensorflow-cpu; tf-keras goes to nodeps.txt.
    expected = {pins.requirement_name(d) for d in declared} - {"tf-keras", "tensorflow"}
    assert {pins.requirement_name(line) for line in serving} == expected | {"tensorflow-cpu"}
    assert all("==" in line for line in serving)
    assert serving[0].startswith("tensorflow-cpu==")


def test_serving_pins_keep_the_markers_of_a_universal_lock() -> None:
    # uv's universal lock (make lock): markers on lock lines and on dependencies, "# via" comments.
    lock = pins.read_lock(
        "tensorflow==2.21.0\n    # via spo-service (pyproject.toml)\ntf-keras==2.21.0\n"
        "numpy==2.4.6 ; python_full_version < '3.13'\nnumpy==2.5.0 ; python_full_version >= '3.13'\n"
        "setuptools==84.2.1 ; python_full_version >= '3.12'\n"
    )
    serving, constraints, _ = pins.serving_pins(
        [
            "tensorflow==2.21.0",
            "tf-keras==2.21.0",
            "numpy==2.4.6",
            "setuptools==84.2.1; python_version >= '3.12'",
        ],
        lock,
    )
    assert serving == [
        "tensorflow-cpu==2.21.0",
        "numpy==2.4.6 ; (python_full_version < '3.13')",
        "numpy==2.5.0 ; (python_full_version >= '3.13')",
        "setuptools==84.2.1 ; (python_version >= '3.12') and (python_full_version >= '3.12')",
    ]
    assert "numpy==2.5.0 ; (python_full_version >= '3.13')" in constraints
