"""The routes nginx allows are exactly the app's routes (issue 20: nginx answered 405 for
``POST /v1/models/NAME/extract``, its allow-list named only ``/v1/extract``). Over the rendered
configuration, no nginx needed: the other direction (each app route's methods are nginx's) is
``test_nginx.py::test_nginx_allow_list_agrees_with_the_app``."""

from __future__ import annotations

import re
from pathlib import Path

from flask import Flask
from flask.testing import FlaskClient

from app.core.settings import DEFAULT_MODEL_DIR, Settings
from app.serving.nginx import render_nginx_conf


def _conf(tmp_path: Path) -> str:
    return render_nginx_conf(
        Settings(model_dir=DEFAULT_MODEL_DIR),
        listen="127.0.0.1:1",
        upstream="unix:/run/g.sock",
        prefix=tmp_path,
    )


def _allow_map(text: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """The ``$spo_allow`` map: (regex, methods) entries and the default methods."""
    block = re.search(r"map \$request_uri \$spo_allow \{(.*?)\}", text, re.DOTALL)
    assert block is not None
    entries = re.findall(r'^\s*"~([^"]+)"\s+"([^"]+)";', block.group(1), re.M)
    default = re.search(r'^\s*default\s+"([^"]+)";', block.group(1), re.M)
    assert entries and default is not None
    return [(r, set(a.split(", "))) for r, a in entries], set(default.group(1).split(", "))


def _routes(app: Flask) -> dict[str, set[str]]:
    """An example path of every app route (``<name>`` as ``ner``) and the methods it takes."""
    return {
        re.sub(r"<[^>]+>", "ner", rule.rule): set(rule.methods or ())
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static" and "<path" not in rule.rule
    }


def test_nginx_allow_entries_are_app_routes(fake_client: FlaskClient, tmp_path: Path) -> None:
    entries, default = _allow_map(_conf(tmp_path))
    routes = _routes(fake_client.application)
    for regex, allowed in entries:
        matched = [path for path in routes if re.match(regex, path)]
        assert matched, f"nginx allows {sorted(allowed)} on {regex}, no app route's path"
        for path in matched:
            assert routes[path] == allowed, f"{path}: app {routes[path]}, nginx {allowed}"
    unmatched = [path for path in routes if not any(re.match(r, path) for r, _ in entries)]
    assert unmatched, "every route has an entry: the default allows nothing the app has"
    for path in unmatched:
        assert routes[path] == default, f"{path}: app {routes[path]}, nginx default {default}"


NOT_ROUTES = ("/v1/models/a/b/extract", "/v1/extractx", "/v1/models//extract")


def test_nginx_allows_post_on_both_extract_routes(fake_client: FlaskClient, tmp_path: Path) -> None:
    entries, default = _allow_map(_conf(tmp_path))

    def allowed(path: str) -> set[str]:
        return next((a for r, a in entries if re.match(r, path)), default)

    for path in ("/v1/extract", "/v1/models/ner/extract", "/v1/models/ner/extract?x=1"):
        assert "POST" in allowed(path), path
    # A path that is no extract route gets no POST from nginx, and the app agrees: 404, or 405
    # with nginx's methods (werkzeug reads "//" as "/", so a GET route).
    for path in NOT_ROUTES:
        assert "POST" not in allowed(path), path
        response = fake_client.post(path, json={"text": "北京"})
        assert response.status_code in (404, 405), path
        if response.status_code == 405:
            assert set(response.headers["Allow"].split(", ")) == allowed(path), path


def test_nginx_proxies_every_path_to_the_app(tmp_path: Path) -> None:
    """One proxied location, ``/``: nginx refuses no route of the app by path; its other locations
    are internal (its own problem answers), which a client cannot reach."""
    text = _conf(tmp_path)
    locations = re.findall(r"location\s+(=\s*\S+|\S+)\s*\{(.*?)\n\s*\}", text, re.DOTALL)
    assert locations
    proxied = [where for where, body in locations if "proxy_pass" in body]
    assert proxied == ["/"]
    for where, body in locations:
        assert where == "/" or "internal;" in body, where
