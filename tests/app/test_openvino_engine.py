"""The service on an openvino model directory (``spo export-openvino``): the real loader picks the
engine, and the API answers as on the TF session."""

from __future__ import annotations

import time
from pathlib import Path

from flask.testing import FlaskClient

from app import create_app
from app.core.settings import Settings

TEXTS = ["李明出生于北京，毕业于清华大学。", "《红楼梦》的作者是曹雪芹。", "短"]


def _settings(**kwargs: object) -> Settings:
    return Settings(workers=1, max_texts=8, max_text_chars=300, **kwargs)  # type: ignore[arg-type]


def test_openvino_engine_serves_the_same_answers_as_the_tf_session(
    openvino_model_dirs: dict[str, Path], triples_model_dir: Path, client: FlaskClient
) -> None:
    models = (("ov", openvino_model_dirs["fp32"]), ("ov8", openvino_model_dirs["int8"]))
    app = create_app(_settings(models=models))
    ov_client = app.test_client()
    try:
        deadline = time.monotonic() + 120
        while ov_client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ov_client.get("/readyz").status_code == 200
        listed = ov_client.get("/v1/models").get_json()
        assert listed["default"] == "ov" and [m["name"] for m in listed["models"]] == ["ov", "ov8"]
        assert ov_client.get("/v1/model").get_json()["engine"] == {
            "name": "openvino",
            "precision": "fp32",
        }
        assert ov_client.get("/v1/models/ov8").get_json()["engine"]["precision"] == "int8"
        got = ov_client.post("/v1/extract", json={"texts": TEXTS})
        want = client.post("/v1/extract", json={"texts": TEXTS})
        assert got.status_code == want.status_code == 200
        assert got.get_json()["results"] == want.get_json()["results"]
        int8 = ov_client.post("/v1/models/ov8/extract", json={"texts": TEXTS})
        assert int8.status_code == 200 and len(int8.get_json()["results"]) == len(TEXTS)
        bad = ov_client.post("/v1/extract", json={"texts": ["a", 2]})
        assert bad.status_code == 422 and bad.get_json()["field"] == "texts[1]"
        long = ov_client.post("/v1/extract", json={"texts": ["长" * 301]})
        assert long.status_code in (413, 422) and "300" in long.get_json()["detail"]
    finally:
        app.extensions["spo"].close()


def test_openvino_engine_refuses_int8_on_an_fp32_directory_at_start(
    openvino_model_dirs: dict[str, Path],
) -> None:
    """int8 needs an int8 openvino directory: the worker stays unready, 503 with the reason's code."""
    app = create_app(_settings(model_dir=openvino_model_dirs["fp32"], precision="int8"))
    slot = app.extensions["spo"]
    try:
        deadline = time.monotonic() + 60
        while slot.error_code != "unsupported_precision" and time.monotonic() < deadline:
            time.sleep(0.05)
        response = app.test_client().get("/readyz")
        assert response.status_code == 503
        assert response.get_json()["code"] == "unsupported_precision"
    finally:
        slot.close()


def test_openvino_engine_is_served_without_jemalloc(
    openvino_model_dirs: dict[str, Path], triples_model_dir: Path
) -> None:
    """OpenVINO 2026.4.1 aborts compiling a model under a preloaded jemalloc: spo serve leaves it
    out (and takes it out of an inherited LD_PRELOAD) when any served model is an openvino one."""
    from app.core.settings import JEMALLOC_PATH
    from app.serving.launch import gunicorn_command, openvino_models

    mixed = _settings(models=(("tf", triples_model_dir), ("ov", openvino_model_dirs["int8"])))
    assert openvino_models(mixed) == ["ov"]
    _, env = gunicorn_command(mixed, environ={"LD_PRELOAD": f"{JEMALLOC_PATH}:/lib/other.so"})
    assert env["LD_PRELOAD"] == "/lib/other.so"
    tf_only = _settings(model_dir=triples_model_dir)
    assert openvino_models(tf_only) == []
    _, env = gunicorn_command(tf_only, environ={})
    assert (str(JEMALLOC_PATH) in env.get("LD_PRELOAD", "")) == tf_only.use_jemalloc
