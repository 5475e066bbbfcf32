"""The opt-in openvino engine (``nlp.openvino_runtime``): same results as the TF session, clear
refusals, a fixed set of compiled shapes."""

from __future__ import annotations

import builtins
import json
import shutil

import numpy as np
import pytest

from nlp.errors import InvalidInput, ManifestError, ModelLoadError, UnsupportedPrecision
from nlp.manifest import load_manifest
from tests import PROJECT_ROOT

TEXTS = [
    "李明出生于北京，毕业于清华大学。",
    "《红楼梦》的作者是曹雪芹，他的妻子是王氏。",
    "短",
    "这是一段比较长的文本。" * 12,
    "ＡＢＣ全角字母和emoji😀混在一起。",
]


def _kwargs(manifest, **changes):
    return {
        "input_names": manifest.input_names,
        "output_names": manifest.output_names,
        "n_outputs": 3,
        "vocab_size": 100,
        **changes,
    }


def test_openvino_manifest_records_both_files_tools_and_quantization(openvino_model_dirs):
    fp32 = load_manifest(openvino_model_dirs["fp32"])
    int8 = load_manifest(openvino_model_dirs["int8"])
    assert fp32.engine == int8.engine == "openvino"
    spec = fp32.engine_spec
    assert spec.file.name == "model.xml" and spec.weights == spec.file.with_suffix(".bin")
    assert spec.precision == "fp32" and spec.quantization is None and spec.opset is None
    assert set(spec.tools) == {"openvino", "nncf"}
    assert fp32.summary()["engine"] == {"name": "openvino", "precision": "fp32"}
    assert fp32.precision == "fp32"
    # int8: NNCF's settings and the calibration set, in the engine section and at the top level.
    assert int8.precision == "int8" and int8.engine_spec.precision == "int8"
    made = int8.engine_spec.quantization
    assert made == int8.quantization
    assert made["method"].startswith("nncf.quantize") and made["preset"] == "mixed"
    assert made["calibration"]["texts"] == 60 and "spo make-corpus" in made["calibration"]["source"]
    assert not (openvino_model_dirs["fp32"] / "saved_model.pb").exists()


def test_openvino_runtime_outputs_match_the_tf_session(triples_model_dir, openvino_model_dirs):
    from nlp.openvino_runtime import OpenVinoRuntime
    from nlp.runtime import SessionRuntime

    tf_manifest = load_manifest(triples_model_dir)
    m = load_manifest(openvino_model_dirs["fp32"])
    shapes = [(1, 16), (2, 32), (8, 64), (4, 16)]
    tf_runtime = SessionRuntime(
        triples_model_dir,
        shapes=shapes,
        input_names=tf_manifest.input_names,
        output_names=tf_manifest.output_names,
        n_outputs=3,
        vocab_size=100,
    )
    ov_runtime = OpenVinoRuntime(m.engine_spec.file, **_kwargs(m, shapes=shapes))
    rng = np.random.default_rng(1)
    for batch, length in shapes:
        ids = rng.integers(5, 5000, size=(batch, length))
        ids[0, length // 2 :] = 0  # padding, masked to -inf by the heads
        want = tf_runtime.run(ids, np.zeros_like(ids))
        got = ov_runtime.run(ids, np.zeros_like(ids))
        again = ov_runtime.run(ids, np.zeros_like(ids))
        for a, b, c in zip(want, got, again, strict=True):
            assert a.shape == b.shape
            assert not np.isnan(b).any()
            assert np.array_equal(np.isinf(a), np.isinf(b))
            finite = np.isfinite(a)
            np.testing.assert_allclose(b[finite], a[finite], rtol=1e-4, atol=1e-4)
            np.testing.assert_array_equal(b, c)  # results are copies, not the request's buffers
    assert ov_runtime.runs == 2 * len(shapes)
    assert ov_runtime.shapes_fed == set(shapes)
    tf_runtime.close()
    ov_runtime.close()


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_openvino_engine_extracts_like_tf_fp32(triples_model_dir, openvino_model_dirs, precision):
    from nlp.pipeline import Extractor

    with Extractor.load(triples_model_dir) as reference:
        want = reference.extract_batch(TEXTS)
    with Extractor.load(openvino_model_dirs[precision]) as ex:
        assert type(ex.runtime).__name__ == "OpenVinoRuntime"
        assert ex.runtime.quantized == (precision == "int8")
        got = ex.extract_batch(TEXTS)
        assert [ex.extract(t) for t in TEXTS] == got
        # Every call went to a shape warmed at load: the compiled model meets no new shape.
        assert ex.runtime.shapes_fed <= ex.runtime.shapes == frozenset(ex.buckets.shapes())
    if precision == "fp32":
        assert got == want
    else:
        # Random tiny weights sit on knife edges; int8 agrees on most texts (the demo figures in
        # docs/training.md hold it to the stated tolerance on trained weights).
        same = sum(a.triples == b.triples for a, b in zip(got, want, strict=True))
        assert same >= len(TEXTS) - 2


def test_openvino_runtime_refuses_unwarmed_shapes_and_other_precisions(
    openvino_model_dirs, monkeypatch
):
    from nlp import engine
    from nlp.openvino_runtime import OpenVinoRuntime

    m = load_manifest(openvino_model_dirs["fp32"])
    runtime = OpenVinoRuntime(m.engine_spec.file, **_kwargs(m, shapes=[(1, 16)]))
    for shape in [(1, 17), (2, 16), (1, 8)]:
        ids = np.ones(shape, dtype=np.int64)
        with pytest.raises(InvalidInput, match="not one of the warmed bucket shapes"):
            runtime.run(ids, np.zeros_like(ids))
    ids = np.ones((1, 16), dtype=np.int64)
    with pytest.raises(InvalidInput):
        runtime.run(ids, np.zeros((2, 16), dtype=np.int64))
    assert runtime.runs == 0 and runtime.shapes_fed == set()
    runtime.close()
    with pytest.raises(UnsupportedPrecision, match="needs an int8 OpenVINO model directory"):
        OpenVinoRuntime(m.engine_spec.file, **_kwargs(m, shapes=[(1, 16)], precision="int8"))
    int8 = load_manifest(openvino_model_dirs["int8"])
    for precision in ("fp32", "bf16"):
        with pytest.raises(UnsupportedPrecision, match="runs only with precision int8"):
            OpenVinoRuntime(
                int8.engine_spec.file, **_kwargs(int8, shapes=[(1, 16)], precision=precision)
            )
    monkeypatch.setattr(engine, "cpu_supports_bf16", lambda: False)
    with pytest.raises(UnsupportedPrecision, match="native bf16"):
        OpenVinoRuntime(m.engine_spec.file, **_kwargs(m, shapes=[(1, 16)], precision="bf16"))


def test_openvino_runtime_runs_bf16_on_a_cpu_with_bf16(openvino_model_dirs):
    from nlp import engine
    from nlp.openvino_runtime import OpenVinoRuntime

    if not engine.cpu_supports_bf16():
        pytest.skip("this CPU has no native bf16")
    m = load_manifest(openvino_model_dirs["fp32"])
    runtime = OpenVinoRuntime(m.engine_spec.file, **_kwargs(m, shapes=[(2, 16)], precision="bf16"))
    ids = np.full((2, 16), 7, dtype=np.int64)
    outputs = runtime.run(ids, np.zeros_like(ids))
    assert [o.shape[0] for o in outputs] == [2, 2, 2] and not np.isnan(outputs[0]).any()
    runtime.close()


def test_openvino_runtime_names_wrong_tensors(openvino_model_dirs):
    from nlp.openvino_runtime import OpenVinoRuntime

    m = load_manifest(openvino_model_dirs["fp32"])
    bad = _kwargs(m, shapes=[(1, 16)], input_names=("nope", m.input_names[1]))
    with pytest.raises(ModelLoadError, match="nope") as info:
        OpenVinoRuntime(m.engine_spec.file, **bad)
    assert info.value.field == "inputs[0]"
    bad = _kwargs(m, shapes=[(1, 16)], output_names=list(m.output_names)[:2])
    with pytest.raises(ModelLoadError, match="outputs"):
        OpenVinoRuntime(m.engine_spec.file, **bad)


def test_openvino_engine_refuses_a_tampered_or_missing_model_file(openvino_model_dirs, tmp_path):
    from nlp.openvino_runtime import OpenVinoRuntime
    from nlp.pipeline import Extractor

    target = tmp_path / "model"
    shutil.copytree(openvino_model_dirs["fp32"], target)
    with (target / "model.bin").open("r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00" * 64)
    with pytest.raises(ManifestError, match=r"engine\.weights_sha256") as info:
        Extractor.load(target)
    assert info.value.field == "engine.weights_sha256"
    (target / "model.xml").write_text("<not an IR/>", encoding="utf-8")
    with pytest.raises(ManifestError) as info:
        Extractor.load(target)
    assert info.value.field == "engine.sha256"
    with pytest.raises(ModelLoadError, match="cannot load the OpenVINO model"):
        OpenVinoRuntime(target / "model.xml", shapes=[(1, 16)], input_names=None,
                        output_names=None, n_outputs=3, vocab_size=100)  # fmt: skip
    with pytest.raises(ModelLoadError, match="cannot load the OpenVINO model"):
        OpenVinoRuntime(tmp_path / "missing.xml", shapes=[(1, 16)], input_names=None,
                        output_names=None, n_outputs=3, vocab_size=100)  # fmt: skip


def test_openvino_engine_without_openvino_names_the_install_command(
    openvino_model_dirs, monkeypatch
):
    from nlp.pipeline import Extractor

    real_import = builtins.__import__

    def no_openvino(name, *args, **kwargs):
        if name == "openvino" or name.startswith("openvino."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_openvino)
    with pytest.raises(ModelLoadError, match=r"pip install 'spo-service\[openvino\]'") as info:
        Extractor.load(openvino_model_dirs["fp32"])
    assert info.value.field == "engine"


BAD_ENGINE = [
    ("engine.name", lambda e: {**e, "name": "tensorrt"}),
    ("engine.file", lambda e: {**e, "file": "../elsewhere.xml"}),
    ("engine.file", lambda e: {**e, "file": "model.bin"}),
    ("engine.file", lambda e: {**e, "file": "missing.xml"}),
    ("engine.sha256", lambda e: {**e, "sha256": "0" * 64}),
    ("engine.weights", lambda e: {k: v for k, v in e.items() if k != "weights"}),
    ("engine.weights", lambda e: {**e, "weights": "../model.bin"}),
    ("engine.weights", lambda e: {**e, "weights": "missing.bin"}),
    ("engine.weights_sha256", lambda e: {**e, "weights_sha256": "0" * 64}),
    ("engine.weights_sha256", lambda e: {k: v for k, v in e.items() if k != "weights_sha256"}),
    ("engine.precision", lambda e: {**e, "precision": "int4"}),
    ("engine.quantization", lambda e: {**e, "precision": "int8", "quantization": None}),
    ("engine.tools.nncf", lambda e: {**e, "tools": {"nncf": 3.4}}),
]


@pytest.mark.parametrize(("field", "change"), BAD_ENGINE, ids=[f for f, _ in BAD_ENGINE])
def test_openvino_manifest_engine_errors_name_the_field(
    openvino_model_dirs, tmp_path, field, change
):
    target = tmp_path / "model"
    shutil.copytree(openvino_model_dirs["fp32"], target)
    path = target / "model.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["engine"] = change(doc["engine"])
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(ManifestError) as info:
        load_manifest(target)
    assert info.value.field == field


def test_openvino_is_imported_only_by_its_runtime_and_exporter():
    """Serving a SavedModel never needs the extra: in nlp, only nlp/openvino_runtime.py imports
    openvino; in training, only training/openvino_export.py imports openvino or nncf."""
    import ast

    importers = set()
    for package in ("nlp", "app", "training"):
        for path in sorted((PROJECT_ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                if any(n.split(".")[0] in ("openvino", "nncf") for n in names):
                    importers.add(path.relative_to(PROJECT_ROOT).as_posix())
    assert importers == {"nlp/openvino_runtime.py", "training/openvino_export.py"}
