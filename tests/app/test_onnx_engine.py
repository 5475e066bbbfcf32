"""The service on an onnx model directory (``spo export-onnx``): the real loader picks the engine."""

from __future__ import annotations

import time
from pathlib import Path

from flask.testing import FlaskClient

from app import create_app
from app.core.settings import Settings

TEXTS = ["李明出生于北京，毕业于清华大学。", "《红楼梦》的作者是曹雪芹。", "短"]


def _settings(model_dir: Path, **kwargs: object) -> Settings:
    return Settings(model_dir=model_dir, workers=1, max_texts=8, max_text_chars=300, **kwargs)  # type: ignore[arg-type]


def test_onnx_engine_serves_the_same_answers_as_the_tf_session(
    onnx_model_dirs: dict[str, Path], client: FlaskClient
) -> None:
    app = create_app(_settings(onnx_model_dirs["fp32"]))
    onnx_client = app.test_client()
    assert onnx_client.get("/readyz").status_code == 200
    model = onnx_client.get("/v1/model").get_json()
    assert model["engine"] == {"name": "onnx", "precision": "fp32", "opset": 17}
    got = onnx_client.post("/v1/extract", json={"texts": TEXTS})
    want = client.post("/v1/extract", json={"texts": TEXTS})
    assert got.status_code == want.status_code == 200
    assert got.get_json()["results"] == want.get_json()["results"]
    bad = onnx_client.post("/v1/extract", json={"texts": ["a", 2]})
    assert bad.status_code == 422 and bad.get_json()["field"] == "texts[1]"


def test_onnx_engine_refuses_bf16_at_start(onnx_model_dirs: dict[str, Path]) -> None:
    """bf16 is a tf-engine mode: the worker stays unready and answers 503 with the reason's code."""
    app = create_app(_settings(onnx_model_dirs["fp32"], precision="bf16"))
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
