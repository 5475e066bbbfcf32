"""No import cycle in ``nlp``, lazy ones included: every import statement of every module counts,
at module level, inside functions and under ``if TYPE_CHECKING``."""

import ast
from pathlib import Path

import pytest

from tests import PROJECT_ROOT


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of package ``root`` it imports anywhere in its source."""
    modules = {_module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in modules}

    def known(name: str) -> str | None:
        """``name``, or the nearest package above it, if it is a module of ``root``."""
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                # ``from pkg import mod`` imports the submodule ``pkg.mod`` when there is one.
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                found = known(target)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, ..., a]``), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_imports_nlp_has_no_cycle():
    graph = import_graph(PROJECT_ROOT / "nlp")
    assert "nlp.pipeline" in graph["nlp.loader"]  # the lazy import is seen
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


@pytest.mark.parametrize(
    ("sources", "cycle"),
    [
        # a function-level import closing the loop (nlp.config <-> nlp.pipeline, before issue 20)
        (
            {"config.py": "def load():\n    from pkg.pipeline import X\n", "pipeline.py": "from pkg import config\n"},
            ["pkg.config", "pkg.pipeline", "pkg.config"],
        ),
        # a relative import, and one under TYPE_CHECKING
        (
            {"a.py": "from .b import x\n", "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"},
            ["pkg.a", "pkg.b", "pkg.a"],
        ),
        ({"a.py": "import pkg.b\n", "b.py": "import json\n"}, None),
    ],
)  # fmt: skip
def test_imports_find_cycle_sees_lazy_and_relative_imports(tmp_path, sources, cycle):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("", encoding="utf-8")
    for name, text in sources.items():
        (root / name).write_text(text, encoding="utf-8")
    assert find_cycle(import_graph(root)) == cycle
