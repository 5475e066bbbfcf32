"""Several models in one service (issue 13): ``SPO_MODELS``, ``app.web.registry``, ``/v1/models``,
``/v1/models/<name>/extract``, ``/readyz`` over every model, ``spo extract --model NAME|DIR``.

The models here are fakes over hand-written ``model.json`` files (no TensorFlow); the live test of two
real models under gunicorn is in ``test_live.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from flask import Flask

from app import create_app
from app.core.settings import DEFAULT_MODEL_DIR, Settings, SettingsError
from nlp.config import LoadOptions
from nlp.manifest import manifest_document, write_manifest
from tests.app.conftest import FakeExtractor


def fake_model_dir(root: Path, name: str, task: str, version: str = "1") -> Path:
    directory = root / name
    directory.mkdir()
    write_manifest(
        directory,
        manifest_document(
            name=name,
            version=version,
            task=task,
            vocab_path="vocab.txt",
            vocab_sha256="0" * 64,
            max_length=64,
            predicates=[{"predicate": "出生地", "subject_type": "人物", "object_type": "地点"}]
            if task == "triples"
            else None,
            entity_types=["人物", "地点"] if task == "entities" else None,
        ),
    )
    return directory


@pytest.fixture
def model_dirs(tmp_path: Path) -> dict[str, Path]:
    return {
        "spo": fake_model_dir(tmp_path, "spo", "triples", version="3"),
        "ner": fake_model_dir(tmp_path, "ner", "entities", version="5"),
    }


@pytest.fixture
def two_models(model_dirs: dict[str, Path]) -> Settings:
    table = ",".join(f"{name}={path}" for name, path in model_dirs.items())
    return Settings.from_env({"SPO_MODELS": table, "SPO_WORKERS": "1", "SPO_MAX_TEXTS": "8"})


class Loader:
    """A loader that hands out one fake extractor per model directory and records each call."""

    def __init__(self, block: Path | None = None) -> None:
        self.extractors: dict[Path, FakeExtractor] = {}
        self.block = block
        self.release = threading.Event()

    def __call__(self, options: LoadOptions) -> FakeExtractor:
        if options.model_dir == self.block:
            self.release.wait(10)
        return self.extractors.setdefault(options.model_dir, FakeExtractor(options.model_dir))


@pytest.fixture
def make_app(two_models: Settings) -> Callable[..., tuple[Flask, Loader]]:
    def make(loader: Loader | None = None, **changes: Any) -> tuple[Flask, Loader]:
        loader = loader or Loader()
        return create_app(two_models.replace(**changes), loader=loader), loader

    return make


# -- settings -------------------------------------------------------------------------------------
def test_registry_settings_models_table_default_first(
    two_models: Settings, model_dirs: dict[str, Path]
) -> None:
    assert two_models.model_table == (("spo", model_dirs["spo"]), ("ner", model_dirs["ner"]))
    assert two_models.default_model == "spo"
    assert two_models.load_options(model_dirs["ner"]).model_dir == model_dirs["ner"]


def test_registry_settings_bare_directory_is_named_after_it(model_dirs: dict[str, Path]) -> None:
    settings = Settings.from_env({"SPO_MODELS": f"{model_dirs['ner']}, main={model_dirs['spo']}"})
    assert [name for name, _ in settings.model_table] == ["ner", "main"]


def test_registry_settings_model_dir_is_the_one_model_shorthand(
    model_dirs: dict[str, Path],
) -> None:
    settings = Settings.from_env({"SPO_MODEL_DIR": str(model_dirs["ner"])})
    assert settings.model_table == (("ner", model_dirs["ner"]),)
    assert Settings().model_table == (("demo", DEFAULT_MODEL_DIR),)


def test_registry_settings_a_directory_name_that_is_no_model_name_is_made_one(
    tmp_path: Path, model_dirs: dict[str, Path]
) -> None:
    """SPO_MODEL_DIR served "my demo" (a newline too) although names are URL segments."""
    import shutil

    spaced = tmp_path / "my demo"
    shutil.copytree(model_dirs["ner"], spaced)
    for env in ({"SPO_MODEL_DIR": str(spaced)}, {"SPO_MODELS": str(spaced)}):
        assert Settings.from_env(env).model_table == (("my-demo", spaced),)
    assert Settings.from_env({"SPO_MODELS": str(model_dirs["ner"])}).resolve_model(str(spaced)) == (
        "my-demo",
        spaced,
    )


def test_registry_settings_report_every_bad_model_at_once(
    tmp_path: Path, model_dirs: dict[str, Path]
) -> None:
    (tmp_path / "empty").mkdir()
    table = (
        f"spo={model_dirs['spo']},spo={model_dirs['ner']},bad/name={model_dirs['ner']},"
        f"gone={tmp_path / 'nowhere'},hollow={tmp_path / 'empty'}"
    )
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"SPO_MODELS": table, "SPO_MODEL_DIR": str(model_dirs["ner"])})
    text = str(caught.value)
    assert "not both" in text
    assert "'spo' is given twice" in text
    assert "'bad/name' must be" in text
    assert f"gone: not a directory: {tmp_path / 'nowhere'}" in text
    assert "hollow: no model.json" in text
    with pytest.raises(SettingsError, match="names no directory"):
        Settings.from_env({"SPO_MODELS": "ner="})


def test_registry_settings_resolve_model_by_name_or_directory(
    two_models: Settings, model_dirs: dict[str, Path]
) -> None:
    assert two_models.resolve_model(None) == ("spo", model_dirs["spo"])
    assert two_models.resolve_model("ner") == ("ner", model_dirs["ner"])
    assert two_models.resolve_model(str(model_dirs["ner"])) == ("ner", model_dirs["ner"])
    with pytest.raises(ValueError, match=r"neither a model name \(spo, ner\)"):
        two_models.resolve_model("nope")


# -- the service ----------------------------------------------------------------------------------
def test_registry_each_model_is_loaded_once_with_its_own_directory(
    make_app: Callable[..., tuple[Flask, Loader]], model_dirs: dict[str, Path]
) -> None:
    app, loader = make_app()
    assert set(loader.extractors) == set(model_dirs.values())
    models = app.extensions["spo.models"]
    assert models.names == ["spo", "ner"] and models.ready
    assert app.extensions["spo"] is models.default.slot
    assert models.get("ner").slot.extractor is loader.extractors[model_dirs["ner"]]


def test_registry_lists_models_with_version_task_and_labels(
    make_app: Callable[..., tuple[Flask, Loader]],
) -> None:
    client = make_app()[0].test_client()
    answer = client.get("/v1/models")
    assert answer.status_code == 200
    assert answer.json == {
        "default": "spo",
        "models": [
            {
                "name": "spo",
                "state": "ready",
                "version": "3",
                "task": "triples",
                "labels": ["出生地"],
            },
            {
                "name": "ner",
                "state": "ready",
                "version": "5",
                "task": "entities",
                "labels": ["人物", "地点"],
            },
        ],
    }
    assert client.get("/v1/models/ner").json["entity_types"] == ["人物", "地点"]
    assert client.get("/v1/model").json["name"] == "spo"


def test_registry_extract_runs_the_named_model_and_default_runs_the_first(
    make_app: Callable[..., tuple[Flask, Loader]], model_dirs: dict[str, Path]
) -> None:
    app, loader = make_app()
    client = app.test_client()
    ner = client.post("/v1/models/ner/extract", json={"texts": ["我在北京", "北京"]})
    assert ner.status_code == 200
    assert ner.json["model"] == {"name": "ner", "version": "5", "task": "entities"}
    assert [len(r["entities"]) for r in ner.json["results"]] == [1, 1]
    default = client.post("/v1/extract", json={"text": "上海"})
    assert default.json["model"]["name"] == "spo"
    named_default = client.post("/v1/models/spo/extract", json={"text": "天津"})
    assert named_default.json["model"]["name"] == "spo"
    assert loader.extractors[model_dirs["ner"]].calls == [["我在北京", "北京"]]
    assert loader.extractors[model_dirs["spo"]].calls == [["上海"], ["天津"]]


@pytest.mark.parametrize(
    ("method", "path"),
    [("post", "/v1/models/nope/extract"), ("get", "/v1/models/nope"), ("get", "/v1/models/..")],
)
def test_registry_unknown_model_is_a_404_problem_listing_the_names(
    make_app: Callable[..., tuple[Flask, Loader]], method: str, path: str
) -> None:
    client = make_app()[0].test_client()
    answer = getattr(client, method)(path, json={"text": "北京"})
    assert answer.status_code == 404
    assert answer.mimetype == "application/problem+json"
    problem = answer.json
    assert problem["code"] == "unknown_model"
    assert path.split("/")[3] in problem["detail"] and "spo, ner" in problem["detail"]


def test_registry_unknown_model_is_reported_before_the_body_is_checked(
    make_app: Callable[..., tuple[Flask, Loader]],
) -> None:
    client = make_app()[0].test_client()
    bad = client.post("/v1/models/ner/extract", json={"texts": []})
    assert bad.status_code == 422 and bad.json["code"] == "empty_texts"
    # An unknown model is reported first: its name is what is wrong with the request.
    unknown = client.post("/v1/models/nope/extract", json={"texts": []})
    assert unknown.json["code"] == "unknown_model"


def test_registry_readyz_waits_for_every_model(
    make_app: Callable[..., tuple[Flask, Loader]], model_dirs: dict[str, Path]
) -> None:
    loader = Loader(block=model_dirs["ner"])
    app, _ = make_app(loader, load_mode="background")
    client = app.test_client()
    try:
        models = app.extensions["spo.models"]
        for _ in range(200):
            if models.get("spo").slot.ready:
                break
            threading.Event().wait(0.05)
        assert models.get("spo").slot.ready and not models.ready
        waiting = client.get("/readyz")
        assert waiting.status_code == 503 and waiting.json["code"] == "model_not_ready"
        assert "'ner' is still loading" in waiting.json["detail"]
        assert client.post("/v1/extract", json={"text": "北京"}).status_code == 200
        busy = client.post("/v1/models/ner/extract", json={"text": "北京"})
        assert busy.status_code == 503 and busy.headers["Retry-After"]
        listed = client.get("/v1/models").json["models"]
        assert listed[1] == {
            "name": "ner",
            "state": "loading",
            "version": None,
            "task": None,
            "labels": None,
        }
    finally:
        loader.release.set()
    for _ in range(200):
        if models.ready:
            break
        threading.Event().wait(0.05)
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json["models"] == {
        "spo": {"name": "spo", "version": "3", "task": "triples"},
        "ner": {"name": "ner", "version": "5", "task": "entities"},
    }


def test_registry_a_model_that_fails_to_load_leaves_the_others_serving(
    two_models: Settings, model_dirs: dict[str, Path]
) -> None:
    from nlp.errors import ModelLoadError

    def loader(options: LoadOptions) -> FakeExtractor:
        if options.model_dir == model_dirs["ner"]:
            raise ModelLoadError("broken ner model")
        return FakeExtractor(options.model_dir)

    app = create_app(two_models.replace(load_retry_max_s=3600), loader=loader)
    client = app.test_client()
    assert client.post("/v1/extract", json={"text": "北京"}).status_code == 200
    broken = client.post("/v1/models/ner/extract", json={"text": "北京"})
    assert broken.status_code == 503 and broken.json["code"] == "model_load_error"
    assert "'ner' failed to load" in broken.json["detail"]
    assert client.get("/readyz").status_code == 503
    states = {m["name"]: m["state"] for m in client.get("/v1/models").json["models"]}
    assert states == {"spo": "ready", "ner": "failed"}


def test_registry_microbatching_gives_each_model_its_own_batcher(
    make_app: Callable[..., tuple[Flask, Loader]],
) -> None:
    app, _ = make_app(microbatch_wait_ms=2, threads=4)
    models = app.extensions["spo.models"]
    client = app.test_client()
    assert client.post("/v1/models/ner/extract", json={"text": "北京"}).status_code == 200
    assert client.post("/v1/extract", json={"text": "北京"}).status_code == 200
    assert app.extensions["spo.microbatch"] is models.default.batcher
    stats = models.close_batchers(timeout=5)
    assert stats["ner"]["requests"] == 1 and stats["spo"]["requests"] == 1


def test_registry_openapi_documents_the_model_routes(
    make_app: Callable[..., tuple[Flask, Loader]],
) -> None:
    spec = make_app()[0].test_client().get("/openapi.json").json
    for path in ("/v1/models", "/v1/models/{name}", "/v1/models/{name}/extract"):
        assert path in spec["paths"], path
    extract = spec["paths"]["/v1/models/{name}/extract"]["post"]
    assert extract["parameters"][0]["schema"]["enum"] == ["spo", "ner"]
    client = make_app()[0].test_client()
    for path, method, kwargs in [
        ("/v1/models", "get", {}),
        ("/v1/models/ner", "get", {}),
        ("/v1/models/nope", "get", {}),
        ("/v1/models/ner/extract", "post", {"json": {"text": "北京"}}),
        ("/v1/models/nope/extract", "post", {"json": {"text": "北京"}}),
        ("/v1/models/ner/extract", "post", {"json": {"texts": []}}),
    ]:
        answer = getattr(client, method)(path, **kwargs)
        template = path.replace("/ner", "/{name}").replace("/nope", "/{name}")
        declared = spec["paths"][template][method]["responses"].get(str(answer.status_code))
        assert declared is not None, f"{method} {path} answered {answer.status_code}"
        if answer.status_code >= 400:
            codes = declared["content"]["application/problem+json"]["schema"]["allOf"][1]
            assert answer.json["code"] in codes["properties"]["code"]["enum"]


# -- spo extract --model NAME|DIR -----------------------------------------------------------------
@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    import app.batch.command as command

    seen: list[Any] = []

    def fake_run_batch(options: Any, **_: Any) -> Any:
        seen.append(options)
        raise SystemExit(0)

    monkeypatch.setattr(command, "run_batch", fake_run_batch)
    return seen


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "spo"),
        (["--model", "ner"], "ner"),
        (["--model", "{ner_dir}"], "ner"),
        (["--model-dir", "{ner_dir}"], "ner"),
    ],
)
def test_registry_batch_model_option_resolves_like_the_service(
    captured: list[Any], model_dirs: dict[str, Path], args: list[str], expected: str
) -> None:
    from app.cli import main

    env = {"SPO_MODELS": f"spo={model_dirs['spo']},ner={model_dirs['ner']}"}
    args = [a.format(ner_dir=model_dirs["ner"]) for a in args]
    result = CliRunner().invoke(main, ["extract", "-", *args], input="x\n", env=env)
    assert result.exit_code == 0, result.output
    assert captured[0].model_dir == model_dirs[expected]


def test_registry_batch_unknown_model_names_the_known_ones(
    captured: list[Any], model_dirs: dict[str, Path]
) -> None:
    from app.cli import main

    env = {"SPO_MODELS": f"spo={model_dirs['spo']},ner={model_dirs['ner']}"}
    result = CliRunner().invoke(main, ["extract", "-", "--model", "nope"], input="x\n", env=env)
    assert result.exit_code == 2 and not captured
    assert "neither a model name (spo, ner) nor a model directory" in result.stderr


def test_registry_an_app_built_to_be_checked_loads_no_model(two_models: Settings) -> None:
    """`spo serve --check-config` builds the app and exits at once: no load may start (a load cut off
    inside TensorFlow at exit aborts the process)."""
    loader = Loader()
    for mode in ("boot", "background"):
        app = create_app(two_models.replace(load_mode=mode), loader=loader, load_models=False)
        assert loader.extractors == {}
        assert app.test_client().get("/readyz").status_code == 503
    create_app(two_models.replace(load_mode="boot"), loader=loader)
    assert len(loader.extractors) == 2  # the same settings load both models when built to serve
