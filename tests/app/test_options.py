"""``app.core.options``: one declaration per option, the same flag on every command that takes it."""

from __future__ import annotations

import json
from typing import Any

import click
import pytest
from click.testing import CliRunner

from app.batch.command import extract
from app.cli import main
from app.core.options import OPTIONS, SETTINGS, click_options
from app.core.settings import Settings, SettingsError
from app.spark.command import spark_extract
from tests import PROJECT_ROOT

SHARED = sorted(o.name for o in OPTIONS.values() if {"extract", "spark-extract"} <= o.commands)


def _probe(command: str) -> click.Command:
    """A command with ``command``'s table flags that prints what it was given."""

    @click.command()
    @click_options(command)
    def probe(**values: Any) -> None:
        click.echo(json.dumps(values, default=str))

    return probe


def _given(command: str, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(_probe(command), list(args))
    assert result.exit_code == 0, result.output
    values: dict[str, Any] = json.loads(result.output)
    return values


def _param(command: click.Command, name: str) -> click.Option:
    return next(p for p in command.params if isinstance(p, click.Option) and p.name == name)


def test_options_shared_flags_are_one_declaration() -> None:
    assert {
        "model",
        "precision",
        "max_text_chars",
        "input_format",
        "text_field",
        "id_field",
    } <= set(SHARED)
    for name in SHARED:
        mine, theirs = _param(extract, name), _param(spark_extract, name)
        assert (mine.opts, mine.default, mine.help, mine.metavar) == (
            theirs.opts,
            theirs.default,
            theirs.help,
            theirs.metavar,
        ), name
        assert not mine.hidden and not theirs.hidden


def test_options_help_lists_every_choice() -> None:
    """``--precision CHOICE`` hid fp32|bf16|int8 (a metavar replaced click's own list)."""
    from app.cli import main

    for name, command in main.commands.items():
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            help_text = CliRunner().invoke(main, [name, "--help"]).output
            if isinstance(param.type, click.Choice):
                listed = f"[{'|'.join(map(str, param.type.choices))}]"
                assert param.metavar in (None, listed) or "|" in param.metavar, (name, param.name)
                assert listed in help_text or param.metavar in help_text, (name, param.name)
    assert "--precision [fp32|bf16|int8]" in CliRunner().invoke(main, ["extract", "--help"]).output


def test_options_input_and_output_format_are_named_for_what_they_are() -> None:
    assert _param(extract, "input_format").opts == ["--input-format"]
    assert _param(spark_extract, "input_format").opts == ["--input-format"]
    assert _param(spark_extract, "output_format").opts == ["--output-format"]
    assert not any(p.name == "output_format" for p in extract.params)


@pytest.mark.parametrize(
    ("command", "args", "expected"),
    [
        ("extract", ["--format", "jsonl"], {"input_format": "jsonl"}),
        ("extract", ["--input-format", "txt"], {"input_format": "txt"}),
        ("extract", ["--model-dir", "models/x"], {"model": "models/x"}),
        ("extract", [], {"input_format": "auto", "model": None, "shard": [1, 1]}),
        ("spark-extract", ["--format", "parquet"], {"output_format": "parquet"}),
        ("spark-extract", ["-m", "ner"], {"model": "ner", "input_format": "auto"}),
    ],
)
def test_options_old_spellings_still_work(
    command: str, args: list[str], expected: dict[str, Any]
) -> None:
    values = _given(command, *args)
    assert {k: values[k] for k in expected} == expected
    assert not any(k.startswith("old_") for k in values)


@pytest.mark.parametrize(
    ("command", "args", "message"),
    [
        ("extract", ["--format", "jsonl", "--input-format", "txt"], "--input-format or --format"),
        ("extract", ["--model", "a", "--model-dir", "b"], "give --model or --model-dir, not both"),
        ("spark-extract", ["--format", "parquet", "--output-format", "jsonl"], "--output-format"),
    ],
)
def test_options_flag_and_its_old_spelling_together_is_a_usage_error(
    command: str, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(_probe(command), args)
    assert result.exit_code == 2 and message in result.output


@pytest.mark.parametrize("command", ["extract", "spark-extract"])
def test_options_flag_checked_as_its_variable(command: str) -> None:
    """``--max-text-chars 0`` fails with the words ``SPO_MAX_TEXT_CHARS=0`` fails with."""
    result = CliRunner().invoke(_probe(command), ["--max-text-chars", "0"])
    assert result.exit_code == 2
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"SPO_MAX_TEXT_CHARS": "0"}, require_model=False)
    words = info.value.problems[0].split(": ", 1)[1]
    assert words == "must be between 1 and 1000000, got 0"
    assert words in result.output
    bad = CliRunner().invoke(_probe(command), ["--max-text-chars", "many"])
    assert bad.exit_code == 2 and "expected an integer, got 'many'" in bad.output


def test_options_shard_is_parsed_by_its_declaration() -> None:
    assert _given("extract", "--shard", "2/8")["shard"] == [2, 8]
    result = CliRunner().invoke(_probe("extract"), ["--shard", "9/8"])
    assert result.exit_code == 2 and "expected 1 <= K <= N, got '9/8'" in result.output


def test_options_spark_extract_model_is_a_name_or_a_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``spark-extract --model NAME`` resolves as ``spo extract``'s does, before Spark is needed."""
    monkeypatch.setenv("SPO_MODELS", f"demo={PROJECT_ROOT / 'models' / 'demo'}")
    monkeypatch.delenv("SPO_MODEL_DIR", raising=False)
    for command in ("extract", "spark-extract"):
        result = CliRunner().invoke(main, [command, "in.txt", "out", "--model", "nosuch"])
        assert result.exit_code == 2, result.output
        assert "'nosuch' is neither a model name (demo) nor a model directory" in result.output


def test_options_serve_flags_are_the_settings() -> None:
    """``spo serve --bind/--workers`` are ``SPO_BIND``/``SPO_WORKERS``: named by the help, checked
    with the other settings (the flag's text stands in for the variable's)."""
    serve = main.commands["serve"]
    for name in ("bind", "workers"):
        option = _param(serve, name)
        assert option.default is None and SETTINGS[name].var in (option.help or "")
        assert SETTINGS[name].help[1:] in (option.help or "")  # its first letter a capital


def test_options_doctests_hold() -> None:
    import doctest

    import app.core.options as options_module

    assert doctest.testmod(options_module).failed == 0
