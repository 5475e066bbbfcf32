"""``nlp.loader.load_extractor``: the TF session's opt-ins (issue 24 part 3) reach ``SessionRuntime``
through ``LoadOptions``, each logs one line where it cannot apply, and another engine warns that it
ignores them.

The int8 directory is the tiny model marked int8 in its model.json (what ``spo quantize`` marks; the
int8 path runs it frozen, with int8 session options), which needs a CPU with VNNI or AMX.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from nlp import engine
from nlp.config import SHORT_CALL_PLANS, LoadOptions
from nlp.errors import ModelLoadError
from nlp.loader import load_extractor
from tests.conftest import _vocab_tokens

TEXTS = ["张三出生于北京", "《霸王别姬》是陈凯歌执导的电影，张国荣主演。"]


@pytest.fixture(scope="module")
def jittered_dir(make_model_dir):
    """Biases and LayerNorm gains not 0 and 1 (as after training), so the Dense layers keep the
    bias-adds that ``fuse_sibling_dense`` matches (tests/nlp/test_graph_rewrites.py)."""
    return make_model_dir("triples", seed=11, jitter_constants=True)


@pytest.fixture(scope="module")
def int8_dir(jittered_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("int8") / "tiny-int8"
    shutil.copytree(jittered_dir, out)
    doc = json.loads((out / "model.json").read_text(encoding="utf-8"))
    doc.update(precision="int8", quantization={"tool": "test", "tool_version": "0"})
    (out / "model.json").write_text(json.dumps(doc), encoding="utf-8")
    return out


@pytest.fixture
def int8_runs() -> None:
    reason = engine.int8_support()
    if reason is not None:
        pytest.skip(f"int8 cannot run on this CPU: {reason}")


def _scores(extractor) -> list[dict]:
    return [e.to_dict() for e in extractor.extract_batch(TEXTS)]


def _outputs(extractor, length: int) -> list[np.ndarray]:
    ids = np.random.default_rng(0).integers(104, 1000, size=(1, length)).astype(np.int32)
    return extractor.runtime.run(ids, np.zeros_like(ids))


def test_loader_int8_gets_the_measured_thread_plan_and_the_extra_rewrite(
    int8_dir, int8_runs, caplog
):
    caplog.set_level(logging.INFO, logger="nlp.runtime")
    plain = load_extractor(LoadOptions(int8_dir, intra_op_threads=2))
    tuned = load_extractor(
        LoadOptions(
            int8_dir,
            intra_op_threads=2,
            short_call_threads=True,
            extra_rewrites=("fuse_sibling_dense",),
        )
    )
    with plain, tuned:
        assert (
            plain.runtime.thread_plan == () and "fuse_sibling_dense" not in plain.runtime.rewrites
        )
        assert tuned.runtime.frozen and tuned.runtime.thread_plan == SHORT_CALL_PLANS["int8"]
        assert set(tuned.runtime._by_threads) == {1}  # one extra session, on one thread
        assert tuned.runtime.session_threads(16) == 1
        assert tuned.runtime.rewrites["fuse_sibling_dense"] == 2 + 1  # 2 layers' Q/K/V, the heads
        assert _scores(tuned) == _scores(plain)
        assert "sessions on 1 intra-op thread(s) beside the main one's 2" in caplog.text
        for a, b in zip(_outputs(plain, 16), _outputs(tuned, 16), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_loader_thread_plan_at_one_thread_makes_no_second_session(int8_dir, int8_runs, caplog):
    caplog.set_level(logging.INFO, logger="nlp.runtime")
    with load_extractor(
        LoadOptions(int8_dir, intra_op_threads=1, short_call_threads=True)
    ) as extractor:
        assert extractor.runtime._by_threads == {}
        assert extractor.runtime.session_threads(16) == 1
    assert "makes no second session at 1 intra-op thread" in caplog.text


def test_loader_bf16_has_no_measured_plan_and_says_so(jittered_dir, caplog):
    if not engine.cpu_supports_bf16():
        pytest.skip("bf16 needs AVX-512 BF16 or AMX")
    options = LoadOptions(
        jittered_dir,
        precision="bf16",
        intra_op_threads=2,
        short_call_threads=True,
        extra_rewrites=("fuse_sibling_dense",),
    )
    with load_extractor(options) as extractor:
        assert extractor.runtime.frozen and extractor.runtime.thread_plan == ()
        assert extractor.runtime._by_threads == {}
        assert extractor.runtime.rewrites["fuse_sibling_dense"] == 3  # the rewrite still applies
    lines = [r.getMessage() for r in caplog.records if "thread plan" in r.getMessage()]
    assert len(lines) == 1 and "no measured short-call thread plan for bf16" in lines[0]


def test_loader_fp32_serves_from_variables_without_the_rewrites(jittered_dir, caplog):
    options = LoadOptions(
        jittered_dir,
        intra_op_threads=2,
        short_call_threads=True,
        extra_rewrites=("fuse_sibling_dense",),
    )
    plain = load_extractor(LoadOptions(jittered_dir, intra_op_threads=2))
    with load_extractor(options) as extractor, plain:
        assert not extractor.runtime.frozen and extractor.runtime.rewrites == {}
        assert extractor.runtime.thread_plan == ()
        assert _scores(extractor) == _scores(plain)
    assert "apply to frozen graphs" in caplog.text
    assert "no measured short-call thread plan for fp32" in caplog.text


def test_loader_refuses_bad_tf_session_options_before_loading(jittered_dir):
    with pytest.raises(ValueError, match="extra_rewrites must be among fuse_sibling_dense"):
        load_extractor(LoadOptions(jittered_dir, extra_rewrites=("qkv",)))
    with pytest.raises(ValueError, match="short_call_threads needs intra_op_threads"):
        load_extractor(LoadOptions(jittered_dir, short_call_threads=True))


def test_loader_onnx_engine_warns_that_it_ignores_the_tf_session_options(
    triples_model_dir, tmp_path, caplog
):
    """A TF-session option on a model of another engine: one warning line, the model loads as
    without it (the openvino engine takes the same path: ``manifest.engine`` is not ``tf``)."""
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed: make extra-onnx")
    pytest.importorskip("tf2onnx", reason="the onnx extra is not installed: make extra-onnx")
    from training.onnx_export import export_onnx

    onnx_dir = export_onnx(triples_model_dir, tmp_path / "onnx", precision="fp32")
    options = LoadOptions(
        onnx_dir,
        intra_op_threads=2,
        short_call_threads=True,
        extra_rewrites=("fuse_sibling_dense",),
    )
    caplog.set_level(logging.WARNING)
    with (
        load_extractor(options) as extractor,
        load_extractor(LoadOptions(onnx_dir, intra_op_threads=2)) as plain,
    ):
        assert extractor.manifest.engine == "onnx"
        assert _scores(extractor) == _scores(plain)
    lines = [r.getMessage() for r in caplog.records if r.name == "nlp.loader"]
    assert lines == [
        f"{onnx_dir} runs on the onnx engine: short_call_threads=on, "
        "extra_rewrites=fuse_sibling_dense apply to the TF session only and do nothing here"
    ]


# -- a model.json that does not fit its model: one ModelLoadError before warm-up ---------------


def _copy_with(model_dir: Path, target: Path, change) -> Path:
    """A copy of ``model_dir`` whose model.json ``change`` edits (in place)."""
    shutil.copytree(model_dir, target)
    doc = json.loads((target / "model.json").read_text(encoding="utf-8"))
    change(doc, target)
    (target / "model.json").write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return target


def _blank_line_vocab(doc: dict, target: Path) -> None:
    """One blank line more at the end of the vocab: one token more than the embedding's rows."""
    from nlp.manifest import sha256_file

    vocab = target / "vocab.txt"
    vocab.write_bytes(Path(doc["vocab"]["path"]).read_bytes() + b"\n")
    doc["vocab"] = {"path": "vocab.txt", "sha256": sha256_file(vocab)}


MISFITS = [
    ("triples", lambda d, _: d.update(predicates=d["predicates"][:2]), "outputs[1]", "which has 2 (one per predicate"),
    ("triples", lambda d, _: d["predicates"].append({"predicate": "x", "subject_type": "a", "object_type": "b"}), "outputs[1]", "which has 4 (one per predicate"),
    ("triples", lambda d, _: d.update(outputs=[d["outputs"][1], d["outputs"][0], d["outputs"][2]]), "outputs[0]", "role order (entity, head, tail)"),
    ("entities", lambda d, _: d.update(entity_types=d["entity_types"][:2]), "outputs[0]", "which has 2 (one per entity type"),
    ("triples", _blank_line_vocab, "vocab.path", f"vocab.txt has {len(_vocab_tokens()) + 1} tokens, but"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("task", "change", "field", "message"),
    MISFITS,
    ids=["fewer-predicates", "more-predicates", "outputs-out-of-order", "fewer-types", "vocab"],
)
def test_loader_refuses_a_model_json_that_does_not_fit_the_model(
    triples_model_dir, entities_model_dir, tmp_path, task, change, field, message
):
    """Labels that are not the model's heads (which then failed or mislabelled every text), outputs
    out of role order, a vocab with more tokens than the embedding (which failed the warm-up in a
    TensorFlow traceback): one ModelLoadError naming the model, what does not fit and the fix."""
    source = triples_model_dir if task == "triples" else entities_model_dir
    broken = _copy_with(source, tmp_path / "broken", change)
    with pytest.raises(ModelLoadError) as info:
        load_extractor(LoadOptions(broken, intra_op_threads=1))
    assert info.value.field == field
    assert message in info.value.message and str(broken) in info.value.message
