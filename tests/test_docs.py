"""Docs that mirror code cannot drift from it (issue 20): README's model.json table against the fields
the manifest declares (``nlp.manifest.MANIFEST_FIELDS``), docs/rest.md's settings table against
``app.core.settings``, and every flag of every ``spo`` command against the docs about that command.

The metrics table in docs/rest.md is checked against ``app.web.metrics.Metrics`` (at the end). The other
mirrors have their own tests: error codes per route in OpenAPI (``tests/app/test_openapi.py``,
``tests/app/test_openapi_routes.py``), the catalogue in docs/rest.md and docs/batch.md
(``tests/app/test_problems.py``), the routes nginx allows (``tests/app/test_nginx.py``,
``tests/app/test_nginx_routes.py``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest

from app.cli import main
from app.core.options import SETTINGS, settings_table
from app.core.settings import Settings
from nlp.manifest import MANIFEST_FIELDS, parse_manifest
from tests import PROJECT_ROOT

DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _table(text: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        # A cell may hold an escaped pipe (`a\|b`); split on the others.
        cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
        rows.append([c.strip() for c in cells])
    return rows


def _code_names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


# -- model.json -----------------------------------------------------------------------------------
class _Recording(dict[str, Any]):
    """A ``model.json`` document that records every top-level field the parser looks at."""

    def __init__(self, doc: dict[str, Any]) -> None:
        super().__init__(doc)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


def _parser_fields() -> tuple[set[str], set[str]]:
    """The fields ``parse_manifest`` reads from a triples and an entities model.json, and the
    fields those files hold."""
    read: set[str] = set()
    held: set[str] = set()
    for model in ("demo", "ner"):
        directory = PROJECT_ROOT / "models" / model
        doc = _Recording(json.loads(_read(directory / "model.json")))
        parse_manifest(doc, directory, check_files=False)
        read |= doc.read
        held |= set(doc)
    return read, held


def _model_json_rows() -> list[str]:
    """README's model.json table as ``MANIFEST_FIELDS`` makes it: field, type and whether it is
    required (or its default), meaning."""
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for field in MANIFEST_FIELDS:
        rows.append(f"| `{field.name}` | {field.kind_doc}, {field.presence} | {field.doc} |")
    return rows


def test_docs_readme_model_json_table_is_the_declaration() -> None:
    """Issue 20: the table omitted the required ``name``, so a model.json written from it was
    refused. It is now ``MANIFEST_FIELDS`` written out; on a change, paste the table shown."""
    lines = _read(PROJECT_ROOT / "README.md").splitlines()
    start = lines.index("| field | type | meaning |")
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    expected = _model_json_rows()
    assert lines[start:end] == expected, "README's model.json table should be:\n" + "\n".join(
        expected
    )


def test_docs_model_json_declaration_is_what_the_parser_reads() -> None:
    declared = {field.name for field in MANIFEST_FIELDS}
    assert len(declared) == len(MANIFEST_FIELDS) >= 15
    read, held = _parser_fields()
    assert read <= declared, f"the parser reads undeclared fields {sorted(read - declared)}"
    assert held <= declared, f"the demo models write undeclared fields: {sorted(held - declared)}"
    # Between them the two models read every field but the int8-only quantization.
    assert declared - read == {"quantization"}


def test_docs_manifest_docstring_example_names_every_field() -> None:
    """``nlp/manifest.py``'s docstring shows a whole model.json: every declared field."""
    import nlp.manifest

    example = re.search(r"::\n\n\s+\{(.*?)\n\s+\}\n", nlp.manifest.__doc__ or "", re.DOTALL)
    assert example is not None
    top_level = set(re.findall(r'^\s{6}"(\w+)":|,\s+"(\w+)":', example.group(1), re.M))
    named = {a or b for a, b in top_level}
    declared = {field.name for field in MANIFEST_FIELDS}
    assert declared <= named, f"the example lacks {sorted(declared - named)}"


# -- settings -------------------------------------------------------------------------------------
def test_docs_rest_settings_table_is_the_declarations() -> None:
    """docs/rest.md's settings table is ``app.core.options.settings_table()``: every ``SPO_*`` variable,
    its default and its help as ``app/core/options.py`` declares them (``python -m app.core.options`` prints
    the table to paste)."""
    text = _read(PROJECT_ROOT / "docs" / "rest.md")
    rows = _table(text, "| variable | default | meaning |")
    expected = _table(settings_table(), "| variable | default | meaning |")
    assert [r[0] for r in rows] == [f"`{o.var}`" for o in SETTINGS.values()], (
        "docs/rest.md's settings are not app.core.options' (python -m app.core.options prints them)"
    )
    assert rows == expected, "docs/rest.md's settings table differs: python -m app.core.options"


def test_docs_rest_settings_table_names_defaults_as_settings_parse_them() -> None:
    """Each default the table writes is the default ``Settings`` has (a computed one aside)."""
    settings = Settings(require_model=False, workers=1)
    for name, option in SETTINGS.items():
        if option.doc_default is None:
            assert getattr(settings, name) == option.default, name
            if isinstance(option.default, (int, str)) and option.default != "":
                written = option.doc_value().strip("`")
                assert option.parse(written) == option.default, name


# -- command-line flags ---------------------------------------------------------------------------
def _sections() -> list[str]:
    """Every heading's section with its subsections, of README.md and docs/*.md."""
    out = []
    for path in DOCS:
        lines = _read(path).splitlines()
        heads = [
            (i, len(m.group(1))) for i, line in enumerate(lines) if (m := re.match(r"(#+) ", line))
        ]
        for n, (start, level) in enumerate(heads):
            end = next((i for i, lv in heads[n + 1 :] if lv <= level), len(lines))
            out.append("\n".join(lines[start:end]))
    return out


def _commands() -> list[tuple[str, click.Command]]:
    return sorted(main.commands.items())


@pytest.mark.parametrize(("name", "command"), _commands(), ids=[n for n, _ in _commands()])
def test_docs_name_every_flag_of_every_command(name: str, command: click.Command) -> None:
    """Each option of ``spo NAME`` is named in a section of the docs that is about ``spo NAME``
    (one that names it, with its subsections): ``--help`` is not the only place to learn it."""
    about = [s for s in _sections() if re.search(rf"`spo {re.escape(name)}(?![\w-])", s)]
    assert about, f"no section of README.md or docs/ names `spo {name}`"
    missing = []
    for option in command.params:
        if not isinstance(option, click.Option) or option.name == "help":
            continue
        flags = option.opts + option.secondary_opts
        pattern = "|".join(re.escape(f) for f in flags)
        if not any(re.search(rf"(?<![\w-])({pattern})(?![\w-])", s) for s in about):
            missing.append(flags[0])
    assert not missing, f"spo {name}: {missing} in no doc section about it"


# -- metrics --------------------------------------------------------------------------------------
def test_docs_rest_metrics_table_matches_the_declarations() -> None:
    """docs/rest.md's table of ``/metrics`` is ``app.web.metrics.Metrics``' declarations: each metric's
    exposed name (counters with ``_total``), type and labels (per-worker gauges with ``pid``)."""
    from app.web.metrics import Metrics

    declared = {}
    for metric in Metrics.declared():
        kind = metric.kind.lower()
        per_worker = kind == "gauge" and metric.options["multiprocess_mode"] == "liveall"
        name = metric.name + ("_total" if kind == "counter" else "")
        declared[name] = (kind, ("pid",) * per_worker + metric.labels)
    rows = _table(_read(PROJECT_ROOT / "docs" / "rest.md"), "| name | type | labels |")
    documented = {_code_names(r[0])[0]: (r[1], tuple(_code_names(r[2]))) for r in rows}
    assert documented == declared
