"""``spo quantize``: its input checks (fast), and the int8 demo model against its fp32 parent (slow).

The slow tests quantize the committed demo model once per session (``int8_demo_dir``) through the
``spo quantize`` command, on demo-corpus sentences, and serve the result with precision int8.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from app.cli import main
from nlp import engine
from tests import PROJECT_ROOT
from training import quantize as quantize_module
from training.conversion import check_conversion
from training.quantize import SCHEME, QuantizeError, read_calibration

DEMO = PROJECT_ROOT / "models" / "demo"
EVERYDAY = PROJECT_ROOT / "tests" / "training" / "data" / "everyday.jsonl"
F1_TOLERANCE = 0.01
IDENTICAL_SHARE = 0.97


# -- calibration files -------------------------------------------------------------------------


def test_quantize_calibration_reads_json_lines_and_hashes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cal.jsonl"
    lines = [
        {"text": "李白出生于碎叶城。"},
        {"text": "  "},
        {"text": "《静夜思》的作者是李白。", "x": 1},
    ]
    path.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n\n")
    found = read_calibration(path)
    assert found.texts == ("李白出生于碎叶城。", "《静夜思》的作者是李白。")
    assert found.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert found.record() == {"source": "cal.jsonl", "texts": 2, "sha256": found.sha256}


def test_quantize_calibration_reads_plain_text_and_caps_the_count(tmp_path: Path) -> None:
    path = tmp_path / "cal.txt"
    path.write_text("第一句。\n\n第二句。\n第三句。\n", encoding="utf-8")
    found = read_calibration(path, max_texts=2)
    assert found.texts == ("第一句。", "第二句。")
    assert found.source == "cal.txt (first 2 of 3 texts)"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "no calibration texts"),
        (b"\n  \n\t\n", "no calibration texts"),
        (b'{"text": "a"}\nplain line\n', "line 2: not a JSON object"),
        (b'{"text": "a"}\n{"texts": "b"}\n', "line 2: no 'text' string"),
        (b'{"text": ""}\n', "every 'text' is empty"),
        ("李白".encode("gbk"), "not UTF-8"),
    ],
)
def test_quantize_calibration_refuses_unusable_files(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "cal"
    path.write_bytes(content)
    with pytest.raises(QuantizeError, match=message):
        read_calibration(path)


def test_quantize_calibration_reads_json_python_cannot_parse_as_text(tmp_path: Path) -> None:
    """A first line nested past the parser's recursion limit is not a JSON object (it was a
    RecursionError traceback): the file is read as plain text, one text a line."""
    path = tmp_path / "cal"
    deep = '{"a":' * 100_000
    path.write_text(deep + "\n第二句。\n", encoding="utf-8")
    assert read_calibration(path).texts == (deep, "第二句。")


def test_quantize_calibration_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(QuantizeError, match="calibration file not found"):
        read_calibration(tmp_path / "missing.txt")


@pytest.fixture
def quantizer_here() -> None:
    from nlp.engine import int8_support
    from training.quantize import tool_version

    if int8_support() is not None:
        pytest.skip(f"this machine cannot run int8 models: {int8_support()}")
    try:
        tool_version()
    except QuantizeError as exc:  # make test-fast's venv has no quantize extra
        pytest.skip(str(exc))


def test_quantize_calibration_texts_with_no_token_are_refused(
    tmp_path: Path, triples_model_dir: Path, quantizer_here: None
) -> None:
    """Texts of zero-width spaces give no window: the quantizer ended in an AttributeError
    traceback of its own ("'NoneType' object has no attribute 'graph_def'")."""
    from training.quantize import Calibration, quantize

    blank = Calibration(("\u200b", "\u200b\u200b"), "zero-width.txt", "0" * 64)
    with pytest.raises(
        QuantizeError, match=r"zero-width\.txt: none of its 2 texts gives the model"
    ):
        quantize(triples_model_dir, tmp_path / "out", calibration=blank)
    assert not (tmp_path / "out").exists()


def test_quantize_refuses_what_the_loader_refuses_in_one_line(
    tmp_path: Path, make_model_dir: Any, quantizer_here: None
) -> None:
    """A TF2 export (the quantizer saw one opaque function call) and a max_length past the
    position embeddings (calibration padded past them) each ended in pages of tracebacks."""
    import shutil

    tf2 = make_model_dir("triples", mode="tf2")
    long = tmp_path / "long"
    shutil.copytree(make_model_dir("triples"), long)
    doc = json.loads((long / "model.json").read_text(encoding="utf-8"))
    doc.update(max_length=520, length_buckets=[*doc["length_buckets"], 520])
    (long / "model.json").write_text(json.dumps(doc), encoding="utf-8")
    for model, message in (
        (tf2, "runs inside a TF2 function (StatefulPartitionedCall: spo export --mode tf2)"),
        (long, "model.json's max_length 520 is more than the 512 positions"),
    ):
        result = CliRunner().invoke(main, ["quantize", str(model), str(tmp_path / "out")])
        assert result.exit_code == 1 and message in result.output, result.output
        assert "Traceback" not in result.output and result.output.count("\n") == 1
        assert not (tmp_path / "out").exists()


def test_quantize_default_calibration_is_the_demo_corpus() -> None:
    from training.quantize import demo_calibration

    found = demo_calibration(5, seed=3)
    assert len(found.texts) == 5 and all(len(t) > 5 for t in found.texts)
    assert found.source == "demo corpus (spo make-corpus FILE --n 5 --seed 3)"
    assert demo_calibration(5, seed=3) == found


# -- model directories -------------------------------------------------------------------------


def test_quantize_without_the_extra_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(quantize_module.metadata, "version", missing)
    with pytest.raises(QuantizeError, match=r"pip install 'spo-service\[quantize\]'"):
        quantize_module.tool_version()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["MISSING", "OUT"], "model directory not found"),
        ([str(DEMO), str(DEMO)], "is the model directory itself"),
        ([str(DEMO), "OUT", "--calibration", "EMPTY"], "no calibration texts"),
        ([str(DEMO), "OUT", "--calibration", "MISSING"], "calibration file not found"),
        ([str(DEMO), "EXISTING"], "exists (use --force to replace it)"),
    ],
)
def test_quantize_command_refuses_bad_inputs_clearly(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "EMPTY").write_text("\n")
    (tmp_path / "EXISTING").mkdir()
    paths = [str(tmp_path / a) if a.isupper() else a for a in args]
    result = CliRunner().invoke(main, ["quantize", *paths])
    assert result.exit_code == 1, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "OUT").exists()


@pytest.mark.parametrize("holds", ["source", "calibration"])
def test_quantize_never_replaces_a_directory_holding_its_source_or_calibration(
    tmp_path: Path, triples_model_dir: Path, holds: str
) -> None:
    """``spo quantize outer/inner outer --force`` wrote the int8 model over ``outer``, deleting the
    fp32 source inside it (and a calibration file there went the same way)."""
    import shutil

    outer = tmp_path / "outer"
    shutil.copytree(triples_model_dir, outer)
    source = outer / "inner" if holds == "source" else tmp_path / "src"
    shutil.copytree(triples_model_dir, source)
    calibration = (outer if holds == "calibration" else tmp_path) / "cal.txt"
    calibration.write_text("李白出生于碎叶城。\n", encoding="utf-8")
    args = ["quantize", str(source), str(outer), "--force", "--calibration", str(calibration)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    inside = source if holds == "source" else calibration
    assert (
        f"{inside} is inside {outer}, which would be replaced: move it out first" in result.output
    )
    assert (source / "model.json").is_file() and calibration.is_file()


def test_quantize_max_texts_without_a_calibration_file_is_a_usage_error(tmp_path: Path) -> None:
    """It calibrated on the 200 demo texts, the limit silently unused."""
    result = CliRunner().invoke(
        main, ["quantize", str(DEMO), str(tmp_path / "q"), "--max-texts", "5"]
    )
    assert result.exit_code == 2 and "--max-texts is for --calibration" in result.output
    assert not (tmp_path / "q").exists()


def _damaged(source: Path, tmp_path: Path, damage: str) -> Path:
    import shutil

    from nlp.manifest import load_manifest

    model = tmp_path / damage
    shutil.copytree(source, model)
    path = model / "model.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    if damage == "variables":  # cut short: only TensorFlow's restore finds it
        data = next((model / "variables").glob("variables.data-*"))
        data.write_bytes(data.read_bytes()[:100])
    elif damage == "inputs":  # a tensor named without its ":0"
        doc["inputs"] = {"token_ids": "Input-Token", "segment_ids": "Input-Segment:0"}
    else:  # one predicate fewer than the graph's heads: the int8 copy would not load
        doc["predicates"] = doc["predicates"][:-1]
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    load_manifest(model)  # the manifest cannot tell: loading must
    return model


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("variables", "TensorFlow cannot load its SavedModel: "),
        ("inputs", "model.json's inputs and outputs must be tensors of its graph"),
        ("predicates", "output "),
    ],
)
def test_quantize_a_model_tensorflow_cannot_load_is_one_line_naming_it(
    triples_model_dir: Path, tmp_path: Path, damage: str, message: str
) -> None:
    """Both were TensorFlow tracebacks (an OutOfRangeError, a ValueError)."""
    model = _damaged(triples_model_dir, tmp_path, damage)
    with pytest.raises(QuantizeError) as info:
        quantize_module._load_frozen(
            check_conversion(
                model, tmp_path / "out", force=False, action="quantize", error=QuantizeError
            )
        )
    assert str(info.value).startswith(f"{model}: {message}")
    assert "\n" not in str(info.value)


# -- the int8 demo model (slow: quantization, then both models on the demo sets) ----------------


@pytest.mark.slow
def test_quantize_a_failure_keeps_the_model_it_would_replace(
    triples_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--force`` onto an int8 directory: the old one was deleted before the new one moved in, so
    a failure there (a full disk) or a kill lost both. Now the old one is moved aside and put back,
    and nothing staged is left beside it."""
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("张三出生于北京。\n李四毕业于清华大学。\n", encoding="utf-8")
    calib = read_calibration(calibration)
    out = tmp_path / "int8"
    quantize_module.quantize(triples_model_dir, out, calibration=calib)
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real_rename = Path.rename

    def failing(self: Path, target: Path) -> Path:
        if Path(target) == out and self.name == "model":  # the new model moving in
            raise OSError(28, "No space left on device")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", failing)
    args = ["quantize", str(triples_model_dir), str(out), "--force"]
    result = CliRunner().invoke(main, [*args, "--calibration", str(calibration)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.endswith(f"Error: cannot write {out}: No space left on device\n")
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibration.txt", "int8"]


@pytest.mark.slow
def test_compare_warns_when_a_converted_model_is_not_from_its_baseline(
    triples_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An int8 copy compared with another model than the one it was quantized from measures two
    models, not the quantization: ``spo evaluate --baseline`` says so (it said nothing)."""
    from training.evaluate import compare

    calibration = tmp_path / "calibration.txt"
    calibration.write_text("张三出生于北京。\n", encoding="utf-8")
    out = tmp_path / "int8"
    quantize_module.quantize(triples_model_dir, out, calibration=read_calibration(calibration))
    data = tmp_path / "one.jsonl"
    data.write_text('{"text": "张三出生于北京。", "triples": []}\n', encoding="utf-8")
    with caplog.at_level("WARNING", logger="training.evaluate"):
        compare(out, triples_model_dir, data)
        assert "do not come from one model" not in caplog.text
        compare(out, DEMO, data)
    assert "do not come from one model" in caplog.text and str(DEMO) in caplog.text


@pytest.fixture(scope="session")
def int8_demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``spo quantize models/demo`` on 60 demo-corpus sentences (training names, not the held-out)."""
    from training.corpus import write_corpus

    base = tmp_path_factory.mktemp("int8-demo")
    calibration = base / "calibration.jsonl"
    write_corpus(calibration, 60, 3, split="train")
    out = base / "demo-int8"
    result = CliRunner().invoke(
        main, ["quantize", str(DEMO), str(out), "--calibration", str(calibration)]
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="session")
def heldout_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 300 texts of the demo held-out set (``make demo-model``: seed 2, held-out names)."""
    from training.corpus import write_corpus

    path = tmp_path_factory.mktemp("heldout") / "heldout.jsonl"
    write_corpus(path, 300, 2, split="heldout")
    return path


@pytest.mark.slow
def test_quantize_writes_an_int8_model_directory_that_records_its_making(
    int8_demo_dir: Path,
) -> None:
    from nlp.manifest import load_manifest, sha256_file

    manifest = load_manifest(int8_demo_dir)
    parent = load_manifest(DEMO)
    assert manifest.precision == "int8" and parent.precision == "fp32"
    made = manifest.quantization
    assert made is not None
    assert (made["tool"], made["tool_version"]) == ("neural-compressor-tf", "3.10")
    calibration = int8_demo_dir.parent / "calibration.jsonl"
    assert made["calibration"] == {
        "source": "calibration.jsonl",
        "texts": 60,
        "sha256": sha256_file(calibration),
    }
    assert made["parent"]["saved_model_sha256"] == sha256_file(DEMO / "saved_model.pb")
    # Every Dense of the demo encoder and heads (6 layers x 6 + 3 heads x 2) runs in int8.
    assert made["quantized_ops"] == 42
    # The recorded scheme is the graph's (it said symmetric activations: they are MIN_FIRST uint8).
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((int8_demo_dir / "saved_model.pb").read_bytes())
    nodes = saved.meta_graphs[0].graph_def.node
    dtype = lambda node, attr: tf.dtypes.as_dtype(node.attr[attr].type).name  # noqa: E731
    activations = {
        (n.attr["mode"].s.decode(), dtype(n, "T")) for n in nodes if n.op == "QuantizeV2"
    }
    weights = {dtype(n, "T2") for n in nodes if n.op == "QuantizedMatMulWithBiasAndDequantize"}
    assert (activations, weights) == ({("MIN_FIRST", "quint8")}, {"qint8"})
    assert made["scheme"] == SCHEME and "int8 symmetric weights, uint8 asymmetric" in SCHEME
    assert manifest.labels == parent.labels and manifest.length_buckets == parent.length_buckets
    assert manifest.vocab_path == (int8_demo_dir / "vocab.txt").resolve()
    # The weights are variables again (held once when served), not constants in saved_model.pb.
    assert (int8_demo_dir / "variables" / "variables.index").is_file()
    assert (int8_demo_dir / "saved_model.pb").stat().st_size < 2_000_000
    # What a quantized model does not do: be quantized again, or run as anything but int8.
    with pytest.raises(QuantizeError, match="already quantized"):
        check_conversion(
            int8_demo_dir, int8_demo_dir.parent / "again", force=False, action="quantize",
            error=QuantizeError,
        )  # fmt: skip


@pytest.mark.slow
def test_quantize_int8_demo_matches_its_fp32_parent_on_the_demo_sets(
    int8_demo_dir: Path, heldout_path: Path
) -> None:
    from training.evaluate import compare

    for data in (heldout_path, EVERYDAY):
        result = compare(int8_demo_dir, DEMO, data)
        assert result.scores.records == result.baseline.records > 30
        assert abs(result.scores.f1 - result.baseline.f1) <= F1_TOLERANCE, result.to_dict()
        if data == heldout_path:
            assert result.identical_share >= IDENTICAL_SHARE, result.to_dict()
            assert result.baseline.f1 > 0.9  # the parent is the trained demo model


@pytest.mark.slow
def test_quantize_int8_model_serves_only_as_int8(int8_demo_dir: Path) -> None:
    from nlp.errors import UnsupportedPrecision
    from nlp.pipeline import Extractor

    with pytest.raises(UnsupportedPrecision, match="runs only with precision int8, not fp32"):
        Extractor.load(int8_demo_dir, precision="fp32")
    with pytest.raises(UnsupportedPrecision, match="spo quantize"):
        Extractor.load(DEMO, precision="int8")
    with Extractor.load(int8_demo_dir, precision="int8") as extractor:
        ops = {op.type for op in extractor.runtime._graph.get_operations()}
        assert "QuantizedMatMulWithBiasAndDequantize" in ops
        # Served rewritten: the 6 GELUs fused into their int8 Dense, each layer's FFN1 handing u8 to
        # its FFN2, the 13 LayerNorms as one op.
        assert extractor.runtime.rewrites["fuse_quantized_gelus"] == 6
        assert extractor.runtime.rewrites["chain_quantized_dense"] == 6
        assert extractor.runtime.rewrites["flatten_dense_inputs"] == 42
        assert "_QuantizedMatMul" in ops and "Erf" not in ops
        if engine._onednn_layer_norm():
            assert extractor.runtime.rewrites["rewrite_layer_norms"] == 13
        assert extractor.runtime.graph_op_count == extractor.runtime.op_count  # finalized
        found = extractor.extract("李白出生于碎叶城。")
        triples = {(t.subject.span.text, t.predicate, t.object.span.text) for t in found.triples}
        assert triples == {("李白", "出生地", "碎叶城")}


@pytest.mark.slow
def test_evaluate_command_compares_a_model_with_its_baseline(int8_demo_dir: Path) -> None:
    result = CliRunner().invoke(
        main, ["evaluate", str(EVERYDAY), "--model", str(int8_demo_dir), "--baseline", str(DEMO)]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output.strip().splitlines()[-1])
    assert doc["records"] == 32
    assert set(doc) >= {"model", "baseline", "f1_delta", "identical_texts", "identical_share"}
    assert doc["model"]["f1"] == pytest.approx(doc["baseline"]["f1"] + doc["f1_delta"], abs=1e-3)
