"""The ``spo`` group itself (``app.cli``): what every command's error line looks like."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main


@pytest.mark.parametrize(
    ("name", "printed"),
    [
        ("no\nsuch.txt", "no\\nsuch.txt"),
        ("no\rsuch.txt", "no\\rsuch.txt"),
        ("ansi\x1b[2Jname.txt", "ansi\\x1b[2Jname.txt"),
        ("sep\u2028x.txt", "sep\\u2028x.txt"),
    ],
)
def test_cli_an_error_quotes_a_given_path_on_one_line(
    tmp_path: Path, name: str, printed: str
) -> None:
    result = CliRunner().invoke(main, ["extract", str(tmp_path / name)])

    assert result.exit_code == 1
    assert result.output.endswith(
        f"Error: cannot read input {tmp_path}/{printed}: No such file or directory\n"
    ), result.output


def test_cli_an_error_about_a_path_made_from_a_given_one_stays_one_line(tmp_path: Path) -> None:
    data = tmp_path / "in.txt"
    data.write_text("李白出生于碎叶城。\n", encoding="utf-8")
    (tmp_path / "a\nb").write_text("", encoding="utf-8")  # a file where -o wants a directory

    result = CliRunner().invoke(
        main, ["extract", str(data), "-o", str(tmp_path / "a\nb" / "x.jsonl")]
    )

    assert result.exit_code != 0
    assert result.output.strip().splitlines()[-1] == (
        f"Error: cannot write {tmp_path}/a\\nb/x.jsonl: {tmp_path}/a\\nb is a file, not a directory"
    )


def test_cli_an_error_keeps_its_own_lines(tmp_path: Path) -> None:
    # A message written on several lines (what changed since a checkpoint, nginx's refusal) keeps them.
    result = CliRunner().invoke(main, ["serve", "--", "--bind", "127.0.0.1:1", "--workers", "3"])

    assert result.exit_code == 2
    assert "arguments after -- that spo serve decides:\n  " in result.output
