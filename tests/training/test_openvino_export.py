"""``spo export-openvino`` (``training.openvino_export``): its refusals and its model directory."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from app.cli import main as cli
from nlp.manifest import load_manifest
from tests import PROJECT_ROOT

pytest.importorskip("openvino", reason="the openvino extra is not installed: make extra-openvino")
pytest.importorskip("nncf", reason="the openvino extra is not installed: make extra-openvino")

DEMO = PROJECT_ROOT / "models" / "demo"


def _export(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["export-openvino", *args])
    return result.exit_code, result.output


def test_openvino_export_cli_refuses_bad_inputs(openvino_model_dirs, tmp_path):
    out = tmp_path / "exists"
    out.mkdir()
    code, output = _export(str(DEMO), str(out))
    assert code == 1 and "exists (use --force" in output
    code, output = _export(str(tmp_path / "missing"), str(tmp_path / "x"))
    assert code == 2 and "does not exist" in output
    code, output = _export(str(openvino_model_dirs["fp32"]), str(tmp_path / "x"))
    assert code == 1 and "already an openvino model directory" in output
    code, output = _export(str(DEMO), str(tmp_path / "x"), "--precision", "int4")
    assert code == 2 and "'int4' is not one of 'fp32', 'int8'" in output
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    code, output = _export(str(DEMO), str(tmp_path / "x"), "--precision", "int8",
                           "--calibration", str(empty))  # fmt: skip
    assert code == 1 and "no calibration texts" in output
    code, output = _export(str(DEMO), str(tmp_path / "x"), "--calibration", str(empty))
    assert code == 2 and "--calibration is for --precision int8 only" in output
    for force in ([], ["--force"]):
        code, output = _export(str(DEMO), str(DEMO), *force)
        assert code == 1 and "is the model directory itself" in output
    assert not (tmp_path / "x").exists()
    code, output = _export("--help")
    assert (
        code == 0 and "pip install 'spo-service[openvino]'" in output and "--calibration" in output
    )


def test_openvino_export_refuses_onnx_and_int8_sources(triples_model_dir, tmp_path):
    from training.openvino_export import OpenVinoExportError, export_openvino

    onnx_like = tmp_path / "onnx"
    shutil.copytree(triples_model_dir, onnx_like)
    doc = json.loads((onnx_like / "model.json").read_text(encoding="utf-8"))
    (onnx_like / "model.onnx").write_bytes(b"x")
    from nlp.manifest import sha256_file

    doc["engine"] = {"name": "onnx", "file": "model.onnx", "opset": 17, "precision": "fp32",
                     "sha256": sha256_file(onnx_like / "model.onnx"), "tools": {}}  # fmt: skip
    (onnx_like / "model.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(OpenVinoExportError, match="already an onnx model directory"):
        export_openvino(onnx_like, tmp_path / "out")
    int8_like = tmp_path / "int8"
    shutil.copytree(triples_model_dir, int8_like)
    doc = json.loads((int8_like / "model.json").read_text(encoding="utf-8"))
    doc.update(precision="int8", quantization={"tool": "neural-compressor-tf"})
    (int8_like / "model.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(OpenVinoExportError, match="export its fp32 parent"):
        export_openvino(int8_like, tmp_path / "out")
    with pytest.raises(OpenVinoExportError, match="precision must be one of"):
        export_openvino(triples_model_dir, tmp_path / "out", precision="bf16")
    assert not (tmp_path / "out").exists()


def test_openvino_export_int8_without_faker_asks_for_calibration(
    triples_model_dir, tmp_path, monkeypatch
):
    import builtins

    from training.openvino_export import OpenVinoExportError, export_openvino

    real_import = builtins.__import__

    def no_faker(name, *args, **kwargs):
        if name == "faker" or name.startswith("faker."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_faker)
    with pytest.raises(OpenVinoExportError, match="pass --calibration FILE"):
        export_openvino(triples_model_dir, tmp_path / "out", precision="int8")


def test_openvino_export_int8_calibrates_on_the_given_file(triples_model_dir, tmp_path):
    from training.openvino_export import export_openvino

    calibration = tmp_path / "calibration.jsonl"
    lines = [{"text": f"李明{i}出生于北京，毕业于清华大学。"} for i in range(12)]
    calibration.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n")
    out = export_openvino(
        triples_model_dir, tmp_path / "int8", precision="int8", calibration=calibration, samples=8
    )
    manifest = load_manifest(out)
    made = manifest.engine_spec.quantization
    assert made["calibration"]["texts"] == 8
    assert made["calibration"]["source"] == "calibration.jsonl (first 8 of 12 texts)"
    assert manifest.precision == "int8" and manifest.vocab_path == (out / "vocab.txt").resolve()
    assert sorted(p.name for p in out.iterdir()) == [
        "model.bin", "model.json", "model.xml", "vocab.txt",
    ]  # fmt: skip


EVERYDAY = PROJECT_ROOT / "tests" / "training" / "data" / "everyday.jsonl"


@pytest.mark.slow
def test_openvino_export_demo_model_gives_the_same_triples(tmp_path):
    """models/demo through the command line: NNCF int8 (calibrated on the default generator
    sentences) gives the TF session's triples on at least 97% of texts with F1 within 0.01
    (docs/training.md has the full sets; fp32's equality with the TF session is tested on the tiny
    model, output by output, in tests/nlp/test_openvino_runtime.py)."""
    from nlp.pipeline import Extractor
    from training.corpus import write_corpus
    from training.evaluate import gold_triples, read_records, score

    code, output = _export(str(DEMO), str(tmp_path / "int8"), "--precision", "int8")
    assert code == 0, output
    heldout = tmp_path / "heldout.jsonl"
    write_corpus(heldout, 300, 2, split="heldout")  # the demo held-out set's generator and seed
    records = read_records(heldout) + read_records(EVERYDAY)
    texts = [r["text"] for r in records]

    def triples(model_dir):
        with Extractor.load(model_dir) as ex:
            return [r.triples for r in ex.extract_batch(texts)]

    def f1(predicted):
        keys = [
            {(t.subject.span.text, t.predicate, t.object.span.text) for t in p} for p in predicted
        ]
        return score(keys, [gold_triples(r) for r in records]).f1

    reference = triples(DEMO)
    int8 = triples(tmp_path / "int8")
    same = sum(a == b for a, b in zip(int8, reference, strict=True))
    assert same >= 0.97 * len(texts), f"int8: identical triples on {same}/{len(texts)} texts"
    assert abs(f1(int8) - f1(reference)) <= 0.01
    manifest = load_manifest(tmp_path / "int8")
    assert manifest.engine_spec.quantization["calibration"]["texts"] == 300
    # The directory is self-contained: it still loads when moved away from the project.
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "int8", moved)
    assert load_manifest(moved).vocab_path == (moved / "vocab.txt").resolve()
