"""The error catalogue (``app.core.problems``): complete, documented, and what the translator answers."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.batch.records import InvalidJson
from app.core.problems import CATALOGUE, codes
from nlp import errors
from nlp.errors import InvalidInput, ModelLoadError, SpoError
from tests import PROJECT_ROOT
from tests.app.test_api import assert_problem


def _subclasses(cls: type[SpoError]) -> list[type[SpoError]]:
    return [cls, *(s for sub in cls.__subclasses__() for s in _subclasses(sub))]


def _doc(name: str) -> str:
    return (PROJECT_ROOT / "docs" / name).read_text(encoding="utf-8")


def test_problems_catalogue_entries_are_sane() -> None:
    for code, entry in CATALOGUE.items():
        assert entry.code == code and re.fullmatch(r"[a-z][a-z0-9_]*", code)
        assert 400 <= entry.status < 600 and entry.meaning and entry.title
        assert entry.rest or entry.batch


def test_problems_every_library_error_code_is_catalogued() -> None:
    library = [c for c in _subclasses(SpoError) if c.__module__ == errors.__name__]
    assert len(library) >= 6 and InvalidJson in _subclasses(SpoError)
    for cls in _subclasses(SpoError):
        if cls is not SpoError and cls.__module__.split(".")[0] in ("nlp", "app", "training"):
            assert cls.code in CATALOGUE, f"{cls.__qualname__}.code {cls.code!r} is not catalogued"


@pytest.mark.parametrize(("doc", "wanted"), [("rest.md", codes()), ("batch.md", codes(batch=True))])
def test_problems_every_code_is_documented(doc: str, wanted: list[str]) -> None:
    text = _doc(doc)
    missing = [code for code in wanted if f"`{code}`" not in text]
    assert not missing, f"docs/{doc} does not document {missing}"


def test_problems_nginx_answers_only_catalogued_codes() -> None:
    conf = (PROJECT_ROOT / "deploy" / "nginx.conf").read_text(encoding="utf-8")
    found = set(re.findall(r'"code":"([a-z_]+)"', conf))
    assert found and found <= set(CATALOGUE)


class _NewInputError(InvalidInput):
    """A library error added later, with a code of its own that is not catalogued."""

    code = "some_new_input_problem"


class _NewError(SpoError):
    code = "unheard_of"


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (InvalidInput("texts[0] is odd", field="texts[0]"), 422, "invalid_input"),
        (_NewInputError("odd input", field="text"), 422, "some_new_input_problem"),
        (ModelLoadError("tensor x:0 is not in /srv/secret/model"), 503, "model_load_error"),
        (_NewError("no ancestor is catalogued"), 500, "internal_error"),
    ],
)
def test_problems_library_errors_answer_by_their_own_code(
    fake_client: FlaskClient, fake_extractor: Any, exc: SpoError, status: int, code: str
) -> None:
    fake_extractor.fail = exc
    response = fake_client.post("/v1/extract", json={"text": "北京"})
    body = assert_problem(response, status, code, exc.field)
    if status < 500:
        assert body["detail"] == exc.message
    else:
        assert exc.message not in body["detail"] and "secret" not in response.get_data(as_text=True)
