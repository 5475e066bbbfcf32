"""Docs that mirror code cannot drift from it (issue 20): README's model.json table against the fields
the manifest parser reads, docs/rest.md's settings table against ``app.settings``, and every flag of
every ``spo`` command against the docs about that command.

The other mirrors have their own tests: error codes per route in OpenAPI (``tests/app/test_openapi.py``),
the catalogue in docs/rest.md and docs/batch.md (``tests/app/test_problems.py``), the routes nginx
allows (``tests/app/test_nginx.py::test_nginx_allow_list_agrees_with_the_app``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import click
import pytest

from app.cli import main
from app.settings import FIELDS, PREFIX, Settings
from nlp.manifest import parse_manifest
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
    """The fields ``parse_manifest`` reads from a triples and an entities model.json (together: all
    of them), and the fields those files hold."""
    read: set[str] = set()
    held: set[str] = set()
    for model in ("demo", "ner"):
        directory = PROJECT_ROOT / "models" / model
        doc = _Recording(json.loads(_read(directory / "model.json")))
        parse_manifest(doc, directory, check_files=False)
        read |= doc.read
        held |= set(doc)
    return read, held


def test_docs_readme_model_json_table_lists_the_fields_the_parser_reads() -> None:
    rows = _table(_read(PROJECT_ROOT / "README.md"), "| field | meaning |")
    documented = {name for row in rows for name in _code_names(row[0])}
    read, held = _parser_fields()
    assert len(read) >= 15
    assert documented == read, (
        f"README's model.json table lacks {sorted(read - documented)}, "
        f"lists fields the parser never reads {sorted(documented - read)}"
    )
    assert held <= read, f"the demo models write fields nothing reads: {sorted(held - read)}"


def test_docs_manifest_docstring_example_names_every_field() -> None:
    """``nlp/manifest.py``'s docstring shows a whole model.json: every field the parser reads."""
    import nlp.manifest

    example = re.search(r"::\n\n\s+\{(.*?)\n\s+\}\n", nlp.manifest.__doc__ or "", re.DOTALL)
    assert example is not None
    top_level = set(re.findall(r'^\s{6}"(\w+)":|,\s+"(\w+)":', example.group(1), re.M))
    named = {a or b for a, b in top_level}
    read, _ = _parser_fields()
    assert read <= named, f"the example lacks {sorted(read - named)}"


# -- settings -------------------------------------------------------------------------------------
# Defaults computed at run time, and how docs/rest.md states them.
COMPUTED_DEFAULTS = {
    "model_dir": "the embedded demo model",
    "workers": "auto",
    "intra_op_threads": "usable CPUs ÷ workers",
    "pid_file": "/tmp/spo-service-<address>.pid",
    "precision": "the model's own",
}


def _doc_default(value: Any) -> str:
    """A default as docs/rest.md writes it (units and remarks stripped by ``_plain``)."""
    if value is None or value == "" or value == ():
        return "(none)"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _plain(cell: str) -> str:
    """``30 s`` -> ``30``, ``0 (off)`` -> ``0``, ```fp32``` -> ``fp32``."""
    cell = cell.replace("`", "").strip()
    cell = re.sub(r"^(.+?) \([^)]*\)$", r"\1", cell)
    return re.sub(r"^(\d+) s$", r"\1", cell)


def test_docs_rest_settings_table_matches_the_declarations() -> None:
    rows = _table(_read(PROJECT_ROOT / "docs" / "rest.md"), "| variable | default |")
    defaults = {f.name: f.default for f in dataclasses.fields(Settings) if f.name in FIELDS}
    documented: dict[str, str] = {}
    for row in rows:
        names = _code_names(row[0])
        values = [v.strip() for v in row[1].split(" / ")]
        if len(values) == 1:  # one default for every variable of the row
            values *= len(names)
        assert len(values) == len(names), f"{row[0]}: {len(names)} variables, defaults {values}"
        for var, value in zip(names, values, strict=True):
            assert var.startswith(PREFIX), var
            documented[var[len(PREFIX) :].lower()] = value
    assert set(documented) == set(FIELDS), (
        f"docs/rest.md lacks {sorted(set(FIELDS) - set(documented))}, "
        f"documents unknown {sorted(set(documented) - set(FIELDS))}"
    )
    for name, value in documented.items():
        if name in COMPUTED_DEFAULTS:
            assert value.replace("`", "") == COMPUTED_DEFAULTS[name], name
        else:
            assert _plain(value) == _doc_default(defaults[name]), f"SPO_{name.upper()}: {value}"


def test_docs_rest_settings_table_helper_reads_units_and_remarks() -> None:
    assert [_plain(c) for c in ("30 s", "0 (off)", "`fp32`", "(none)", "10000")] == [
        "30",
        "0",
        "fp32",
        "(none)",
        "10000",
    ]


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
