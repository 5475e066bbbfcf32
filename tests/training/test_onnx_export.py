"""``spo export-onnx`` (``training.onnx_export``): the conversion's corrections and its model directory."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from app.cli import main as cli
from nlp.manifest import load_manifest
from tests import PROJECT_ROOT

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed: make extra-onnx")
pytest.importorskip("tf2onnx", reason="the onnx extra is not installed: make extra-onnx")

DEMO = PROJECT_ROOT / "models" / "demo"
EVERYDAY = PROJECT_ROOT / "tests" / "training" / "data" / "everyday.jsonl"


def _tf_and_onnx(build, feed):
    """Outputs of ``build(x)`` run by TF and by ONNX Runtime after ``convert_graph``."""
    import onnxruntime as ort
    import tensorflow as tf

    from training.onnx_export import convert_graph

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None], name="x")
        tf.identity(build(tf, x), name="out")
    with tf.compat.v1.Session(graph=graph) as session:
        want = session.run("out:0", {"x:0": feed})
    model = convert_graph(graph.as_graph_def(), ["x:0"], ["out:0"], 17)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return want, session.run(["out:0"], {"x:0": feed})[0], model


def test_onnx_export_select_with_broadcast_inf_becomes_where_not_nan():
    # The heads' masking: scores where the mask holds, -inf broadcast to the scores' shape elsewhere.
    def build(tf, x):
        neg = tf.broadcast_to(tf.constant(-np.inf), tf.shape(x))
        return tf.where(x > 0, x, neg)

    feed = np.array([[1.0, -2.0, 3.0], [-1.0, 5.0, -0.5]], dtype=np.float32)
    want, got, model = _tf_and_onnx(build, feed)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, want)
    assert "Where" in {n.op_type for n in model.graph.node}


def test_onnx_export_broadcast_args_has_a_handler():
    def build(tf, x):
        row = x[:1, :]  # (1, n) against (m, n): BroadcastArgs computes (m, n)
        shape = tf.raw_ops.BroadcastArgs(s0=tf.shape(row), s1=tf.shape(x))
        return tf.broadcast_to(row, shape) + x

    feed = np.arange(12, dtype=np.float32).reshape(3, 4)
    want, got, _ = _tf_and_onnx(build, feed)
    np.testing.assert_array_equal(got, want)


def test_onnx_export_keeps_identical_constants_apart():
    # Two kernels with equal values (as in a random-init model) and different roles.
    def build(tf, x):
        k = np.ones((2, 2), dtype=np.float32)
        a = tf.matmul(x, tf.constant(k))
        b = tf.matmul(x * 2.0, tf.constant(k.copy()))
        return tf.concat([a, b], axis=1)

    feed = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    want, got, _ = _tf_and_onnx(build, feed)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_onnx_export_cli_refuses_existing_output_and_converted_input(onnx_model_dirs, tmp_path):
    runner = CliRunner()
    out = tmp_path / "exists"
    out.mkdir()
    result = runner.invoke(cli, ["export-onnx", str(DEMO), str(out)])
    assert result.exit_code == 1 and "exists (use --force" in result.output
    result = runner.invoke(cli, ["export-onnx", str(onnx_model_dirs["fp32"]), str(tmp_path / "x")])
    assert result.exit_code == 1 and "already an onnx model directory" in result.output
    result = runner.invoke(cli, ["export-onnx", "--help"])
    assert result.exit_code == 0 and "pip install 'spo-service[onnx]'" in result.output


@pytest.fixture(scope="module")
def demo_onnx(tmp_path_factory):
    """models/demo converted through the command line, fp32 and int8."""
    base = tmp_path_factory.mktemp("demo-onnx")
    runner = CliRunner()
    for precision in ("fp32", "int8"):
        result = runner.invoke(
            cli, ["export-onnx", str(DEMO), str(base / precision), "--precision", precision]
        )
        assert result.exit_code == 0, result.output
    return {p: base / p for p in ("fp32", "int8")}


def _triples(model_dir, texts):
    from nlp.pipeline import Extractor

    with Extractor.load(model_dir) as ex:
        return [r.triples for r in ex.extract_batch(texts)]


@pytest.mark.slow
def test_onnx_export_demo_model_gives_the_same_triples(demo_onnx, tmp_path):
    from training.corpus import write_corpus
    from training.evaluate import gold_triples, read_records, score

    heldout = tmp_path / "heldout.jsonl"
    write_corpus(heldout, 300, 2, split="heldout")  # the demo held-out set's generator and seed
    records = read_records(heldout) + read_records(EVERYDAY)
    texts = [r["text"] for r in records]
    reference = _triples(DEMO, texts)
    fp32 = _triples(demo_onnx["fp32"], texts)
    int8 = _triples(demo_onnx["int8"], texts)
    assert fp32 == reference  # identical triples, text by text
    same = sum(a == b for a, b in zip(int8, reference, strict=True))
    assert same >= 0.97 * len(texts), f"int8: identical triples on {same}/{len(texts)} texts"

    def f1(predicted):
        keys = [
            {(t.subject.span.text, t.predicate, t.object.span.text) for t in p} for p in predicted
        ]
        return score(keys, [gold_triples(r) for r in records]).f1

    assert abs(f1(int8) - f1(reference)) <= 0.01
    manifest = load_manifest(demo_onnx["int8"])
    assert manifest.engine_spec.quantization["method"].endswith("quantize_dynamic")
    doc = json.loads((demo_onnx["int8"] / "model.json").read_text(encoding="utf-8"))
    assert doc["engine"]["source"]["name"] == "demo" and doc["vocab"]["path"] == "vocab.txt"
    # The directory is self-contained: it still loads when moved away from the project.
    moved = tmp_path / "moved"
    shutil.copytree(demo_onnx["fp32"], moved)
    assert load_manifest(moved).vocab_path == (moved / "vocab.txt").resolve()
