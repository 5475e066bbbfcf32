"""``app/`` is a stack of subpackages, each allowed to import only those below it (and ``nlp``).

The rules are the ones each subpackage's docstring states; this test holds them, lazy imports (inside
functions, under ``if TYPE_CHECKING``) included, and finds no import cycle anywhere in ``app``.
"""

import importlib
import importlib.util
import subprocess
import sys

import pytest

from tests import PROJECT_ROOT
from tests.nlp.test_imports import find_cycle, import_graph

# Subpackage -> the subpackages of app it may import (itself always). ``app`` is the factory,
# ``create_app``: it assembles the web layer and registers the batch command on Flask's CLI.
ALLOWED: dict[str, set[str]] = {
    "app.core": set(),
    "app.web": {"app.core"},
    "app.batch": {"app.core"},
    "app.spark": {"app.core", "app.batch"},
    "app.serving": {"app.core", "app"},  # a worker builds the app with the factory, after the fork
    "app.cli": {"app.core", "app.batch", "app.spark", "app.serving", "app.web"},
    "app": {"app.core", "app.web", "app.batch"},
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and ".".join(parts[:2]) in ALLOWED else "app"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(PROJECT_ROOT / "app")


def test_layers_every_module_is_in_a_layer(graph):
    top = sorted(m for m in graph if m.count(".") == 1 and _layer(m) == "app")
    assert top == [], f"modules directly under app/ (put each in its subpackage): {top}"


def test_layers_imports_point_down(graph):
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if _layer(target) != _layer(module) and _layer(target) not in ALLOWED[_layer(module)]
    )
    assert wrong == []


def test_layers_app_has_no_import_cycle(graph):
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_layers_each_package_says_what_it_is_for(package):
    doc = importlib.import_module(package).__doc__ or ""
    assert len(doc.split()) >= 12, (
        f"{package} needs a docstring saying what it is for and may import"
    )


def test_layers_the_processes_that_hand_out_the_model_never_import_tensorflow():
    """The gunicorn master (its config and ``app.serving.master``), the ``spo`` command (the batch
    command's parent) and Spark's driver load no model, so they import no TensorFlow (which took the
    master from 49 to 628 MiB, before the fork): only the processes that run a model do."""
    spark = ", app.spark.job" if importlib.util.find_spec("pyspark") is not None else ""
    code = (
        "import runpy, sys\n"
        f"import app.cli, app.serving.master, app.batch.runner{spark}\n"
        "runpy.run_path('deploy/gunicorn.conf.py')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'tf_keras', 'keras', 'bert4keras')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout[:500]
