"""Every extract example of the README and docs/ is what the committed models answer, byte for byte.

An example is a ``curl ... /extract`` line with ``-d '{...}'`` whose next line is the answer (one
JSON document beginning ``{"model"``), or an ``echo "TEXT" | ... spo extract - [--model DIR]`` line
followed by its record; an answer shortened with ``...`` is an illustration and is not collected. The
README's own examples are also checked through the installed wheel (tests/app/test_install.py); this
module covers every document, so an example cannot go stale when a model is retrained.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from flask.testing import FlaskClient

from app import create_app
from app.cli import main
from app.core.settings import Settings
from tests import PROJECT_ROOT

DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
CURL = re.compile(
    r"\$ curl -s localhost:8000(?P<path>/v1/\S*extract) -H 'Content-Type: application/json' \\\n"
    r"\s*-d '(?P<body>\{.*?\})'\n(?P<answer>\{\"model\".*)\n"
)
ECHO = re.compile(
    r'\$ echo "(?P<text>[^"]*)" \| \S*spo extract -(?: --model (?P<model>\S+))? 2>/dev/null\n'
    r"(?P<answer>\{.*)\n"
)


def _examples(pattern: re.Pattern[str]) -> list[tuple[str, dict[str, str]]]:
    found = []
    for doc in DOCS:
        for match in pattern.finditer(doc.read_text(encoding="utf-8")):
            if "..." not in match["answer"]:
                found.append((doc.name, match.groupdict()))
    return found


CURLS = _examples(CURL)
ECHOES = _examples(ECHO)


def test_doc_examples_are_found() -> None:
    """The patterns still match: the README's two curl and two echo examples at least, and the
    second model's curl example in docs/rest.md."""
    assert sum(doc == "README.md" for doc, _ in CURLS) >= 2
    assert sum(doc == "README.md" for doc, _ in ECHOES) >= 2
    assert any(doc == "rest.md" and "/models/ner/" in e["path"] for doc, e in CURLS)


@pytest.fixture(scope="module")
def both_models() -> Iterator[FlaskClient]:
    """The service as ``make serve`` runs it: models/demo as ``demo`` (the default), models/ner."""
    models = f"demo={PROJECT_ROOT / 'models' / 'demo'},ner={PROJECT_ROOT / 'models' / 'ner'}"
    settings = Settings.from_env({"SPO_MODELS": models, "SPO_WORKERS": "1"})
    yield create_app(settings).test_client()


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "example"), CURLS, ids=[f"{d}:{e['path']}" for d, e in CURLS])
def test_doc_examples_curl_answers_are_the_services(
    both_models: FlaskClient, doc: str, example: dict[str, str]
) -> None:
    response = both_models.post(
        example["path"], data=example["body"].encode(), content_type="application/json"
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.get_data(as_text=True).rstrip("\n") == example["answer"], doc


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "example"), ECHOES, ids=[f"{d}:{e['text']}" for d, e in ECHOES])
def test_doc_examples_spo_extract_records_are_the_commands(
    doc: str, example: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(PROJECT_ROOT)  # the examples name models/ner from the checkout
    args = ["extract", "-", "--workers", "0", "--quiet"]
    if example["model"]:
        args += ["--model", example["model"]]
    result = CliRunner().invoke(main, args, input=example["text"] + "\n")
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    assert json.loads(line) == json.loads(example["answer"]), doc
    assert line == example["answer"], doc
