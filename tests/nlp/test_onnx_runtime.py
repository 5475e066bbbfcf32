"""The opt-in onnx engine (``nlp.onnx_runtime``): same results as the TF session, clear refusals."""

from __future__ import annotations

import builtins
import json
import shutil

import numpy as np
import pytest

from nlp.errors import InvalidInput, ManifestError, ModelLoadError, UnsupportedPrecision
from nlp.manifest import load_manifest

TEXTS = [
    "李明出生于北京，毕业于清华大学。",
    "《红楼梦》的作者是曹雪芹，他的妻子是王氏。",
    "短",
    "这是一段比较长的文本。" * 12,
    "ＡＢＣ全角字母和emoji😀混在一起。",
]


def _onnx(onnx_model_dirs, precision="fp32"):
    return onnx_model_dirs[precision]


def test_onnx_manifest_records_engine_tools_and_quantization(onnx_model_dirs):
    fp32 = load_manifest(onnx_model_dirs["fp32"])
    int8 = load_manifest(onnx_model_dirs["int8"])
    assert fp32.engine == int8.engine == "onnx"
    assert fp32.engine_spec.precision == "fp32" and fp32.engine_spec.quantization is None
    assert int8.engine_spec.precision == "int8"
    assert int8.engine_spec.quantization["weights"] == "int8"
    assert set(fp32.engine_spec.tools) == {"tensorflow", "tf2onnx", "onnx", "onnxruntime"}
    assert fp32.engine_spec.tools["tf2onnx"] == "1.17.0"
    assert fp32.summary()["engine"] == {"name": "onnx", "precision": "fp32", "opset": 17}
    assert not (onnx_model_dirs["fp32"] / "saved_model.pb").exists()


def test_onnx_runtime_outputs_match_the_tf_session(triples_model_dir, onnx_model_dirs):
    from nlp.onnx_runtime import OnnxRuntime
    from nlp.runtime import SessionRuntime

    m = load_manifest(onnx_model_dirs["fp32"])
    shapes = [(1, 16), (2, 32), (8, 64), (4, 16)]
    kwargs = {
        "shapes": shapes,
        "input_names": m.input_names,
        "output_names": m.output_names,
        "n_outputs": 3,
        "vocab_size": 100,
    }
    tf_runtime = SessionRuntime(triples_model_dir, **kwargs)
    ort_runtime = OnnxRuntime(m.engine_spec.file, **kwargs)
    rng = np.random.default_rng(1)
    for batch, length in shapes:
        ids = rng.integers(5, 5000, size=(batch, length))
        ids[0, length // 2 :] = 0  # padding, masked to -inf by the heads
        want = tf_runtime.run(ids, np.zeros_like(ids))
        got = ort_runtime.run(ids, np.zeros_like(ids))
        for a, b in zip(want, got, strict=True):
            assert a.shape == b.shape
            assert not np.isnan(b).any()
            assert np.array_equal(np.isinf(a), np.isinf(b))
            finite = np.isfinite(a)
            np.testing.assert_allclose(b[finite], a[finite], rtol=1e-4, atol=1e-4)
    assert ort_runtime.runs == len(shapes)
    assert ort_runtime.shapes_fed == set(shapes)
    tf_runtime.close()
    ort_runtime.close()


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_onnx_engine_extracts_like_tf_fp32(triples_model_dir, onnx_model_dirs, precision):
    from nlp.pipeline import Extractor

    with Extractor.load(triples_model_dir) as reference:
        want = reference.extract_batch(TEXTS)
    with Extractor.load(onnx_model_dirs[precision]) as ex:
        assert type(ex.runtime).__name__ == "OnnxRuntime"
        got = ex.extract_batch(TEXTS)
        assert [ex.extract(t) for t in TEXTS] == got
        assert ex.runtime.shapes_fed <= set(ex.buckets.shapes())
    if precision == "fp32":
        assert got == want
    else:
        # Random tiny weights sit on knife edges; int8 agrees on most texts (the demo-model test
        # holds it to the stated tolerance on trained weights).
        same = sum(a.triples == b.triples for a, b in zip(got, want, strict=True))
        assert same >= len(TEXTS) - 2


def test_onnx_runtime_refuses_unwarmed_shapes_and_tf_precisions(onnx_model_dirs):
    from nlp.onnx_runtime import OnnxRuntime

    m = load_manifest(onnx_model_dirs["fp32"])
    kwargs = {"input_names": m.input_names, "output_names": m.output_names, "n_outputs": 3}
    runtime = OnnxRuntime(m.engine_spec.file, shapes=[(1, 16)], vocab_size=100, **kwargs)
    ids = np.ones((1, 17), dtype=np.int64)
    with pytest.raises(InvalidInput, match="not one of the warmed bucket shapes"):
        runtime.run(ids, np.zeros_like(ids))
    ids = np.ones((1, 16), dtype=np.int64)
    with pytest.raises(InvalidInput):
        runtime.run(ids, np.zeros((2, 16), dtype=np.int64))
    with pytest.raises(UnsupportedPrecision, match="tf engine"):
        OnnxRuntime(
            m.engine_spec.file, shapes=[(1, 16)], vocab_size=100, precision="bf16", **kwargs
        )
    bad = {**kwargs, "input_names": ("nope:0", m.input_names[1])}
    with pytest.raises(ModelLoadError, match="nope:0") as info:
        OnnxRuntime(m.engine_spec.file, shapes=[(1, 16)], vocab_size=100, **bad)
    assert info.value.field == "inputs[0]"
    bad = {**kwargs, "output_names": list(m.output_names)[:2]}
    with pytest.raises(ModelLoadError, match="outputs"):
        OnnxRuntime(m.engine_spec.file, shapes=[(1, 16)], vocab_size=100, **bad)


def test_onnx_engine_refuses_a_corrupt_or_edited_model_file(onnx_model_dirs, tmp_path):
    from nlp.onnx_runtime import OnnxRuntime
    from nlp.pipeline import Extractor

    target = tmp_path / "model"
    shutil.copytree(onnx_model_dirs["fp32"], target)
    with (target / "model.onnx").open("r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00" * 64)
    with pytest.raises(ManifestError, match=r"engine\.sha256"):
        Extractor.load(target)
    with pytest.raises(ModelLoadError, match="cannot load the ONNX model"):
        (target / "model.onnx").write_bytes(b"not an onnx file")
        OnnxRuntime(target / "model.onnx", shapes=[(1, 16)], input_names=None,
                    output_names=None, n_outputs=3, vocab_size=100)  # fmt: skip


def test_onnx_engine_without_onnxruntime_names_the_install_command(onnx_model_dirs, monkeypatch):
    from nlp.pipeline import Extractor

    real_import = builtins.__import__

    def no_onnxruntime(name, *args, **kwargs):
        if name == "onnxruntime" or name.startswith("onnxruntime."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnxruntime)
    with pytest.raises(ModelLoadError, match=r"pip install 'spo-service\[onnx\]'") as info:
        Extractor.load(onnx_model_dirs["fp32"])
    assert info.value.field == "engine"


BAD_ENGINE = [
    ("engine", lambda e: "onnx"),
    ("engine.name", lambda e: {**e, "name": "tensorrt"}),
    ("engine.file", lambda e: {**e, "file": "../elsewhere.onnx"}),
    ("engine.file", lambda e: {**e, "file": "missing.onnx"}),
    ("engine.sha256", lambda e: {**e, "sha256": "0" * 64}),
    ("engine.opset", lambda e: {**e, "opset": "17"}),
    ("engine.precision", lambda e: {**e, "precision": "int4"}),
    ("engine.quantization", lambda e: {**e, "precision": "int8", "quantization": None}),
    ("engine.quantization", lambda e: {**e, "quantization": {"weights": "int8"}}),
    ("engine.tools", lambda e: {k: v for k, v in e.items() if k != "tools"}),
    ("engine.tools.tf2onnx", lambda e: {**e, "tools": {"tf2onnx": 1.17}}),
]


@pytest.mark.parametrize(("field", "change"), BAD_ENGINE, ids=[f for f, _ in BAD_ENGINE])
def test_onnx_manifest_engine_errors_name_the_field(onnx_model_dirs, tmp_path, field, change):
    target = tmp_path / "model"
    shutil.copytree(onnx_model_dirs["fp32"], target)
    path = target / "model.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["engine"] = change(doc["engine"])
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(ManifestError) as info:
        load_manifest(target)
    assert info.value.field == field
