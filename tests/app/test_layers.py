"""``app/`` is a stack of subpackages, each allowed to import only those below it (and ``nlp``).

The rules are the ones each subpackage's docstring states; this test holds them, lazy imports (inside
functions, under ``if TYPE_CHECKING``) included, and finds no import cycle anywhere in ``app``.
"""

import importlib

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
