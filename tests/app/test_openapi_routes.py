"""``/openapi.json`` per route, swept (issue 20): every operation is sent every kind of request that
can go wrong for it (bad documents, wrong media type, unknown model, missing token, limits, a failing
or slow model), and each problem it answers must be declared for that operation and status; and each
code the document declares for an operation is one it was seen to answer, or one this sweep cannot
provoke in-process (listed with the test that covers it)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask

from app.core.problems import CATALOGUE
from app.core.settings import Settings
from tests.app.conftest import FakeExtractor
from tests.app.test_api import BAD_DOCUMENTS
from tests.app.test_openapi import _declared, _spec

TOKEN = "a-token-of-16-chars-or-more"
# Codes an operation may declare that no in-process request provokes, and where they are tested.
NOT_PROVOKED = {
    "rate_limited": "nginx answers it (test_openapi_declares_nginx_rate_limit_on_the_paths_it_limits)",
    "service_unavailable": "nginx answers it when gunicorn is unreachable (test_nginx.py)",
    "model_not_ready": "a model still loading (test_api.py, background load mode)",
    "model_load_error": "test_openapi_declares_the_load_errors_of_every_model_route",
    "invalid_manifest": "test_openapi_declares_the_load_errors_of_every_model_route",
    "unsupported_precision": "test_openapi_declares_the_load_errors_of_every_model_route",
    "internal_error": "only an extract route calls the model; the others declare it all the same",
    "bad_request": "a request werkzeug cannot parse; every operation declares it (app.web.openapi)",
}
Answer = tuple[str, str, int, str | None]  # (path template, method, status, problem code)


def _operations(app: Flask) -> Iterator[tuple[str, str]]:
    """(OpenAPI path, method) of every API route."""
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.startswith(("web.", "swagger_ui.")):
            continue
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            yield re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule), method.lower()


def _send(app: Flask, path: str, method: str, name: str, **kwargs: Any) -> Answer:
    response = getattr(app.test_client(), method)(path.replace("{name}", name), **kwargs)
    body = response.get_json(silent=True) if response.status_code >= 400 else None
    return path, method, response.status_code, (body or {}).get("code")


def _sweep(app: Flask, model: str, fake: FakeExtractor) -> list[Answer]:
    """Every request of the sweep, to every operation of ``app``."""
    answers = []
    for path, method in _operations(app):
        names = [model, "no-such-model"] if "{name}" in path else [model]
        for name in names:
            if method == "get":
                answers.append(_send(app, path, method, name))
                continue
            send = functools.partial(_send, app, path, method, name)
            answers.append(send(json={"texts": ["北京", "上海"]}))
            answers.append(send(data=b'{"text": "a"}', content_type="text/plain"))
            answers.extend(
                send(data=p.values[0], content_type="application/json") for p in BAD_DOCUMENTS
            )
            fake.fail = RuntimeError("boom")
            answers.append(send(json={"text": "北京"}))
            fake.fail = None
    return answers


@pytest.fixture
def sweep(
    make_fake_app: Callable[..., Flask], fake_extractor: FakeExtractor, settings: Settings
) -> Callable[..., tuple[dict[str, Any], list[Answer]]]:
    def run(delay: float = 0.0, **changes: Any) -> tuple[dict[str, Any], list[Answer]]:
        fake_extractor.delay = delay  # seconds per model call: past SPO_REQUEST_TIMEOUT, a 504
        app = make_fake_app(**changes)
        model = settings.default_model
        return _spec(app.test_client()), _sweep(app, model, fake_extractor)

    return run


CONFIGURATIONS = {
    "plain": {},
    "tokens": {"auth_tokens": (TOKEN,), "metrics_token": "a-metrics-token-16-chars"},
    "small-limits": {"max_body_bytes": 1024, "max_request_tokens": 5},
    "rate-limited": {"rate_limit": "10r/s"},
    "deadline": {"request_timeout": 0.05, "delay": 0.1},
}


def test_openapi_declares_each_problem_each_route_answers(sweep: Callable[..., Any]) -> None:
    for label, changes in CONFIGURATIONS.items():
        spec, answers = sweep(**changes)
        for path, method, status, code in answers:
            declared = _declared(spec, path, method, status)
            assert declared is not None, f"{label}: {method} {path} answered {status} ({code})"
            if status >= 400:
                assert code in declared, f"{label}: {method} {path} answered {status} {code}"


def test_openapi_declares_only_problems_a_route_answers(sweep: Callable[..., Any]) -> None:
    declared: dict[tuple[str, str], set[str]] = {}
    answered: dict[tuple[str, str], set[str]] = {}
    for changes in CONFIGURATIONS.values():
        spec, answers = sweep(**changes)
        for path, operations in spec["paths"].items():
            for method, operation in operations.items():
                codes = declared.setdefault((path, method), set())
                for status in operation["responses"]:
                    codes.update(_declared(spec, path, method, int(status)) or [])
        for path, method, _, code in answers:
            if code is not None:
                answered.setdefault((path, method), set()).add(code)
    assert set(NOT_PROVOKED) <= set(CATALOGUE)
    for operation, codes in declared.items():
        unexplained = codes - answered.get(operation, set()) - set(NOT_PROVOKED)
        assert not unexplained, f"{operation} declares {sorted(unexplained)}, never answered"
