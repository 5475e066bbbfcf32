"""Issue 20: with no precision asked for (no ``--precision``, no ``SPO_PRECISION``), a model runs in
its own (its model.json's), in the library, the service, ``spo extract`` and ``spo spark-extract``; an
explicit precision the model cannot run in still gets the clear ``unsupported_precision`` error.

The int8 directory here is the tiny model with ``"precision": "int8"`` in its model.json (what ``spo
quantize`` writes; quantizing takes minutes, tests/training/test_quantize.py does it): loading it runs
the int8 path (frozen graph, int8 session options), which needs a CPU with VNNI or AMX.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from app import create_app
from app.cli import main
from app.core.settings import Settings
from nlp.config import LoadOptions
from nlp.errors import UnsupportedPrecision

NOT_FP32 = "runs only with precision int8, not fp32"


def _int8_reason() -> str | None:
    from nlp import engine

    return engine.int8_support()


@pytest.fixture(scope="module")
def int8_dir(triples_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's directory marked int8 in its model.json, as `spo quantize` marks its output."""
    out = tmp_path_factory.mktemp("int8") / "tiny-int8"
    shutil.copytree(triples_model_dir, out)
    doc = json.loads((out / "model.json").read_text(encoding="utf-8"))
    doc.update(precision="int8", quantization={"tool": "test", "tool_version": "0"})
    (out / "model.json").write_text(json.dumps(doc), encoding="utf-8")
    return out


@pytest.fixture
def int8_runs() -> None:
    reason = _int8_reason()
    if reason is not None:
        pytest.skip(f"int8 cannot run on this CPU: {reason}")


def test_precision_default_is_the_models_own_in_the_library(
    int8_dir: Path, triples_model_dir: Path, int8_runs: None
) -> None:
    from nlp.pipeline import Extractor

    assert LoadOptions(int8_dir).precision is None
    with Extractor.load(int8_dir) as extractor:
        assert extractor.runtime.precision == "int8"
        assert extractor.extract_batch(["张三出生于北京"])
    with Extractor.load(triples_model_dir) as extractor:
        assert extractor.runtime.precision == "fp32"


def test_precision_engines_given_no_precision_take_the_models_own(
    int8_dir: Path, triples_model_dir: Path
) -> None:
    """``SessionRuntime.for_model`` / ``OnnxRuntime.for_model`` (bench calls them directly)."""
    from nlp.engine import load_arguments
    from nlp.manifest import load_manifest

    def precision(directory: Path, asked: str | None) -> str:
        options = LoadOptions(directory, precision=asked)
        return str(load_arguments(load_manifest(directory), options, [], 0)["precision"])

    assert precision(int8_dir, None) == "int8"
    assert precision(triples_model_dir, None) == "fp32"
    assert precision(triples_model_dir, "bf16") == "bf16"


def test_precision_explicit_conflict_is_still_refused(int8_dir: Path) -> None:
    from nlp.pipeline import Extractor

    with pytest.raises(UnsupportedPrecision, match=NOT_FP32):
        Extractor.load(int8_dir, precision="fp32")


def test_precision_service_without_spo_precision_serves_an_int8_model(
    int8_dir: Path, int8_runs: None
) -> None:
    settings = Settings.from_env({"SPO_MODEL_DIR": str(int8_dir), "SPO_WORKERS": "1"})
    client = create_app(settings).test_client()
    assert client.get("/readyz").status_code == 200
    response = client.post("/v1/extract", json={"texts": ["张三出生于北京"]})
    assert response.status_code == 200, response.get_json()
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'precision="int8"' in metrics


def test_precision_service_with_a_conflicting_spo_precision_says_why(int8_dir: Path) -> None:
    settings = Settings.from_env(
        {"SPO_MODEL_DIR": str(int8_dir), "SPO_WORKERS": "1", "SPO_PRECISION": "fp32"}
    )
    app = create_app(settings)
    try:
        response = app.test_client().get("/readyz")
        assert response.status_code == 503
        assert "unsupported_precision" in response.get_data(as_text=True)
    finally:
        app.extensions["spo.models"].close()  # stop its load retries (they outlived the test)


def test_precision_spo_extract_int8_model_without_a_flag(
    int8_dir: Path, tmp_path: Path, int8_runs: None
) -> None:
    source = tmp_path / "in.txt"
    source.write_text("张三出生于北京\n李四的妻子是王五\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        main, ["extract", "--model", str(int8_dir), "--workers", "1", str(source), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 2 and not any("error" in r for r in records), records


def test_precision_spo_extract_conflicting_flag_is_an_error_record(
    int8_dir: Path, tmp_path: Path
) -> None:
    source = tmp_path / "in.txt"
    source.write_text("张三出生于北京\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    args = ["--model", str(int8_dir), "--precision", "fp32", "--workers", "1", "-o", str(out)]
    result = CliRunner().invoke(main, ["extract", *args, str(source)])
    assert NOT_FP32 in result.output + (out.read_text() if out.exists() else "")


def test_precision_spark_extract_defaults_to_the_models_own(int8_dir: Path) -> None:
    spark = pytest.importorskip("app.spark.job", reason="the spark extra is not installed")
    job = spark._job(int8_dir, 100, None, "text")
    assert job.precision is None
    assert spark.SparkExtractOptions(inputs=("x",), output="y").precision is None
    with pytest.raises(spark.SparkExtractError, match="precision must be one of"):
        spark._job(int8_dir, 100, "fp64", "text")


@pytest.mark.slow
def test_precision_spark_extract_cli_int8_model_without_a_flag(
    int8_dir: Path, tmp_path: Path, int8_runs: None
) -> None:
    pytest.importorskip("app.spark.job", reason="the spark extra is not installed")
    if shutil.which("java") is None:
        pytest.skip("no Java runtime")
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": 1, "text": "张三出生于北京"}\n', encoding="utf-8")
    out = tmp_path / "out"
    args = ["spark-extract", str(source), str(out), "--model", str(int8_dir)]
    result = CliRunner().invoke(main, [*args, "--master", "local[1]"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for p in sorted(out.glob("part-*")) for x in p.read_text().splitlines()]
    assert len(lines) == 1 and "error" not in lines[0], lines
