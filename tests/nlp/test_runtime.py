import json
import shutil

import numpy as np
import pytest

from bench.op_profile import op_time_by_type
from nlp import engine, tf_graph
from nlp.errors import InvalidInput, ModelLoadError, UnsupportedPrecision
from nlp.manifest import load_manifest
from tests.nlp import session_runtime

SHAPES = [(1, 16), (2, 16)]


def _runtime(model_dir, **kwargs):
    return session_runtime(model_dir, SHAPES, **kwargs)


@pytest.fixture(scope="module")
def tf2_model_dir(make_model_dir):
    return make_model_dir("triples", mode="tf2", threshold=0.0)


def test_runtime_graph_and_tf2_exports_give_the_same_scores(triples_model_dir, tf2_model_dir):
    graph_rt = _runtime(triples_model_dir)
    tf2_rt = _runtime(tf2_model_dir)
    assert load_manifest(tf2_model_dir).input_names is None  # resolved from the signature
    ids = np.array([[2, 40, 41, 42, 3] + [0] * 11, [2, 50, 3] + [0] * 13], dtype=np.int32)
    a = graph_rt.run(ids, np.zeros_like(ids))
    b = tf2_rt.run(ids, np.zeros_like(ids))
    assert [o.shape for o in a] == [(2, 2, 16, 16), (2, 3, 16, 16), (2, 3, 16, 16)]
    for x, y in zip(a, b, strict=True):
        finite = np.isfinite(x)
        np.testing.assert_array_equal(finite, np.isfinite(y))
        np.testing.assert_allclose(x[finite], y[finite], rtol=1e-4, atol=1e-3)
    graph_rt.close()
    tf2_rt.close()


def test_runtime_refuses_shapes_it_did_not_warm(triples_model_dir):
    rt = _runtime(triples_model_dir)
    ids = np.zeros((3, 16), dtype=np.int32)
    with pytest.raises(InvalidInput, match="bucket"):
        rt.run(ids, ids)
    assert rt.shapes_fed == set()
    rt.close()


def test_runtime_graph_is_finalized_after_warm_up(triples_model_dir):
    import tensorflow as tf

    rt = _runtime(triples_model_dir)
    count = rt.graph_op_count
    with pytest.raises(RuntimeError, match="finalized"), rt._graph.as_default():
        tf.constant(1.0)
    assert rt.graph_op_count == count
    rt.close()


def test_runtime_names_a_tensor_missing_from_the_graph(triples_model_dir):
    with pytest.raises(ModelLoadError, match="nope:0"):
        _runtime(triples_model_dir, output_names=["nope:0", "head/truediv:0", "tail:0"])


def test_runtime_rejects_wrong_output_rank(triples_model_dir):
    m = load_manifest(triples_model_dir)
    with pytest.raises(ModelLoadError, match="rank"):
        _runtime(triples_model_dir, output_names=[m.input_names[0], *m.output_names[1:]])


def test_runtime_rejects_wrong_output_count(triples_model_dir):
    with pytest.raises(ModelLoadError, match="outputs"):
        _runtime(triples_model_dir, n_outputs=1)


@pytest.mark.parametrize("mode", ["graph", "tf2"])
def test_runtime_refuses_a_vocab_larger_than_the_token_embedding(request, triples_model_dir, mode):
    """Checked before warm-up and naming the vocab: TensorFlow's own error, an index out of range
    in the warm-up's embedding lookup, names neither (one blank line too many does it). A TF2
    export's lookup is inside a function: one token too many was not found there, and a text
    holding it failed alone, as an internal error (HTTP 500)."""
    from tests.conftest import _vocab_tokens

    model_dir = triples_model_dir if mode == "graph" else request.getfixturevalue("tf2_model_dir")
    token_ids = "Input-Token:0" if mode == "graph" else "serving_default_Input-Token:0"
    rows = len(_vocab_tokens())
    with pytest.raises(ModelLoadError) as info:
        _runtime(model_dir, vocab_size=rows + 1, vocab_file="the/vocab.txt")
    assert info.value.field == "vocab.path"
    assert info.value.message.startswith(
        f"the/vocab.txt has {rows + 1} tokens, but the token ids of {model_dir} "
        f"({token_ids}) index a table of {rows} rows (Embedding-Token/embeddings): use the vocab"
    )


def test_runtime_refuses_swapped_input_names_before_warm_up(triples_model_dir):
    token_ids, segment_ids = load_manifest(triples_model_dir).input_names
    with pytest.raises(ModelLoadError, match=r"a table of 2 rows \(Embedding-Segment/embeddings\)"):
        _runtime(triples_model_dir, input_names=(segment_ids, token_ids))


def test_runtime_refuses_a_max_length_beyond_the_position_embeddings(triples_model_dir):
    with pytest.raises(ModelLoadError) as info:
        session_runtime(triples_model_dir, [(1, 16), (1, 520)])
    assert info.value.field == "max_length"
    assert "max_length 520 is more than the 512 positions" in info.value.message
    assert "to at most 512" in info.value.message


def test_runtime_refuses_outputs_with_other_heads_than_model_json_gives(triples_model_dir):
    from nlp.tasks import Task

    m = load_manifest(triples_model_dir)
    heads = Task.TRIPLES.output_heads(m)
    _runtime(triples_model_dir, output_heads=heads).close()  # the fixture's 3 predicates fit
    with pytest.raises(ModelLoadError, match=r"has 3 heads, but model\.json makes it the entity"):
        _runtime(triples_model_dir, output_names=m.output_names[::-1], output_heads=heads)


def test_runtime_warm_up_failure_is_one_model_load_error(tf2_model_dir, monkeypatch):
    """Where the graph hides its sizes (a TF2 export looks up the embeddings inside a function,
    under another name than bert4keras's), the warm-up's own failure is a ModelLoadError line
    naming the model and the shape."""
    import nlp.runtime

    monkeypatch.setattr(nlp.runtime, "lookup_table", lambda ids: None)
    with pytest.raises(ModelLoadError) as info:
        _runtime(tf2_model_dir, vocab_size=10**6)
    assert info.value.message.startswith(
        f"{tf2_model_dir}: the warm-up run of shape (1, 16) failed"
    )
    assert "\n" not in info.value.message


def test_runtime_bad_savedmodel_is_a_model_load_error(triples_model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(triples_model_dir, broken)
    (broken / "saved_model.pb").write_bytes(b"not a protobuf")
    with pytest.raises(ModelLoadError, match=r"saved_model\.sha256"):
        _runtime(broken)  # model.json's record of the graph tells first
    manifest = json.loads((broken / "model.json").read_text(encoding="utf-8"))
    del manifest["saved_model"]  # a model.json written by hand: the runtime tells
    (broken / "model.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(ModelLoadError, match="cannot load"):
        _runtime(broken)


def test_runtime_bf16_is_refused_on_cpus_without_it(triples_model_dir, monkeypatch):
    monkeypatch.setattr(engine, "cpu_supports_bf16", lambda: False)
    with pytest.raises(UnsupportedPrecision, match="bf16"):
        _runtime(triples_model_dir, precision="bf16")
    with pytest.raises(UnsupportedPrecision):
        _runtime(triples_model_dir, precision="fp16")


def test_runtime_int8_is_refused_with_the_probe_reason(triples_model_dir, monkeypatch):
    monkeypatch.setattr(engine, "int8_support", lambda: "no oneDNN in this test")
    with pytest.raises(UnsupportedPrecision, match="int8 cannot run here: no oneDNN in this test"):
        _runtime(triples_model_dir, precision="int8")


def test_runtime_int8_probe_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(engine, "_onednn_enabled", lambda: False)
    monkeypatch.setattr(engine, "_cpu_flags", lambda: {"avx512_vnni", "avx2"})
    assert "TF_ENABLE_ONEDNN_OPTS=0" in engine.int8_support()
    monkeypatch.setattr(engine, "_onednn_enabled", lambda: True)
    assert engine.int8_support() is None
    monkeypatch.setattr(engine, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512bw"})
    assert "no int8 dot-product instructions" in engine.int8_support()
    monkeypatch.setattr(engine, "_cpu_flags", lambda: {"avx2", "avx_vnni"})
    assert engine.int8_support() is None


@pytest.mark.skipif(not engine.cpu_supports_bf16(), reason="this CPU has no bf16 support")
def test_runtime_bf16_runs_and_stays_close_to_fp32(triples_model_dir):
    fp32 = _runtime(triples_model_dir)
    bf16 = _runtime(triples_model_dir, precision="bf16")
    ids = np.array([[2, 40, 41, 42, 3] + [0] * 11], dtype=np.int32)
    a = fp32.run(ids, np.zeros_like(ids))[0][0, :, 1:4, 1:4]
    b = bf16.run(ids, np.zeros_like(ids))[0][0, :, 1:4, 1:4]
    finite = np.isfinite(a)
    assert np.abs(a[finite] - b[finite]).max() < 0.05 * np.abs(a[finite]).max() + 1.0
    assert json.dumps(bf16.precision) == '"bf16"'
    assert bf16.frozen and not fp32.frozen  # runtime_module.FROZEN_PRECISIONS


@pytest.mark.skipif(not engine.cpu_supports_bf16(), reason="this CPU has no bf16 support")
def test_runtime_bf16_serves_an_export_it_cannot_freeze(tf2_model_dir, caplog):
    """A TF2 export's weights live in library functions: bf16 keeps the variables and still runs."""
    fp32 = _runtime(tf2_model_dir)
    bf16 = _runtime(tf2_model_dir, precision="bf16")
    assert not bf16.frozen and "cannot be frozen" in caplog.text
    ids = np.array([[2, 40, 41, 42, 3] + [0] * 11], dtype=np.int32)
    a = fp32.run(ids, np.zeros_like(ids))[0][0, :, 1:4, 1:4]
    b = bf16.run(ids, np.zeros_like(ids))[0][0, :, 1:4, 1:4]
    finite = np.isfinite(a)
    assert np.abs(a[finite] - b[finite]).max() < 0.05 * np.abs(a[finite]).max() + 1.0


def test_freezing_and_bias_folding_keep_the_scores(triples_model_dir):
    """The bf16 load path's graph surgery is exact: run the frozen, folded graph at fp32 and compare."""
    import tensorflow as tf

    reference = _runtime(triples_model_dir)
    graph_def = tf_graph._freeze(
        reference._session, reference._graph, [t.name for t in reference._outputs]
    )
    assert not [n for n in graph_def.node if n.op in ("VarHandleOp", "VariableV2")]
    biases = [n for n in graph_def.node if n.op == "BiasAdd"]
    assert biases and all(n.name.endswith("/before_reshape") for n in biases)
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
    ids = np.array([[2, 40, 41, 42, 3] + [0] * 11, [2, 50, 3] + [0] * 13], dtype=np.int32)
    with tf.compat.v1.Session(graph=graph) as session:
        feed = {graph.get_tensor_by_name(t.name): ids for t in reference._inputs[:1]}
        feed[graph.get_tensor_by_name(reference._inputs[1].name)] = np.zeros_like(ids)
        got = session.run([graph.get_tensor_by_name(t.name) for t in reference._outputs], feed)
    for a, b in zip(reference.run(ids, np.zeros_like(ids)), got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_bias_folding_leaves_other_bias_adds_alone():
    """A BiasAdd straight after a MatMul (no reshape) or after a reshape of something else is kept."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.constant(np.ones((4, 3), np.float32))
        b = tf.constant(np.ones(3, np.float32))
        tf.nn.bias_add(tf.matmul(x, w), b, name="direct")
        tf.nn.bias_add(
            tf.reshape(x, [-1, 2, 2]), tf.constant(np.ones(2, np.float32)), name="noreshape"
        )
    graph_def = graph.as_graph_def()
    assert tf_graph._fold_bias_adds(graph_def) == 0
    assert [n.name for n in graph_def.node if n.op == "BiasAdd"] == ["direct", "noreshape"]


def test_runtime_op_time_by_type_traces_one_call_at_a_warmed_shape(triples_model_dir):
    rt = _runtime(triples_model_dir)
    ids = np.array([[2, 40, 41, 3] + [0] * 12], dtype=np.int32)
    spent = op_time_by_type(rt, ids, np.zeros_like(ids))
    assert spent and all(ms >= 0 for ms in spent.values())
    assert any("MatMul" in t or "Einsum" in t for t in spent)  # the types the runtime ran
    assert rt.runs == 0  # a profile is not a request
    with pytest.raises(InvalidInput, match="bucket"):
        op_time_by_type(rt, np.zeros((3, 16), dtype=np.int32), np.zeros((3, 16), dtype=np.int32))
    assert rt.graph_op_count == rt.op_count  # tracing creates no node
    rt.close()


# -- thread plan (issue 24) ---------------------------------------------------------------------


def test_runtime_thread_plan_picks_the_session_by_length_and_gives_the_same_scores(
    triples_model_dir,
):
    from nlp.runtime import plan_threads

    shapes = [(1, 16), (1, 32), (2, 32)]
    plain = session_runtime(triples_model_dir, shapes, intra_op_threads=2, freeze=True)
    planned = session_runtime(
        triples_model_dir,
        shapes,
        intra_op_threads=2,
        freeze=True,
        thread_plan=((16, 1), (24, 4)),  # 4 is above the bound: capped to the main session's 2
    )
    assert planned.thread_plan == ((16, 1), (24, 4))
    assert [planned.session_threads(n) for n in (1, 16, 17, 24, 32)] == [1, 1, 2, 2, 2]
    assert set(planned._by_threads) == {1}  # one extra session: threads 1
    assert [plan_threads(((16, 1),), n, 3) for n in (16, 17)] == [1, 3]
    used = []
    for threads, session in ((1, planned._by_threads[1]), (2, planned._session)):
        real_run = session.run
        session.run = lambda *a, _run=real_run, _t=threads, **k: used.append(_t) or _run(*a, **k)
    rng = np.random.default_rng(0)
    for batch, length in shapes:
        ids = rng.integers(5, 100, size=(batch, length)).astype(np.int32)
        a_out, b_out = plain.run(ids, np.zeros_like(ids)), planned.run(ids, np.zeros_like(ids))
        for a, b in zip(a_out, b_out, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert used == [1, 2, 2]  # 1x16 on the one-thread session, 1x32 and 2x32 on the main one
    plain.close()
    planned.close()


def test_runtime_thread_plan_is_ignored_for_a_graph_with_variables(triples_model_dir, caplog):
    rt = _runtime(triples_model_dir, intra_op_threads=2, thread_plan=((16, 1),))
    assert not rt.frozen and rt.thread_plan == () and rt.session_threads(16) == 2
    assert "thread plan is for frozen graphs" in caplog.text
    rt.close()


@pytest.mark.parametrize(
    ("plan", "threads", "match"),
    [(((16, 0),), 2, "positive"), (((0, 1),), 2, "positive"), (((16, 1),), None, "upper bound")],
)
def test_runtime_thread_plan_refuses_bad_plans(triples_model_dir, plan, threads, match):
    with pytest.raises(ModelLoadError, match=match):
        _runtime(triples_model_dir, intra_op_threads=threads, freeze=True, thread_plan=plan)


def test_runtime_measured_thread_plans_are_for_frozen_precisions():
    from nlp.runtime import FROZEN_PRECISIONS, SHORT_CALL_PLANS

    assert set(SHORT_CALL_PLANS) <= set(FROZEN_PRECISIONS)
    for plan in SHORT_CALL_PLANS.values():
        assert plan == tuple(sorted(plan)) and all(n > 0 and t == 1 for n, t in plan)


def test_runtime_a_savedmodel_tensorflow_cannot_restore_is_one_line(triples_model_dir, tmp_path):
    """A cut variables file was TensorFlow's whole report: nine lines ending in an empty "Original
    stack trace", never naming what to fix."""
    model = tmp_path / "model"
    shutil.copytree(triples_model_dir, model)
    data = next((model / "variables").glob("variables.data-*"))
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ModelLoadError) as info:
        _runtime(model)
    assert info.value.message.startswith(f"cannot load the SavedModel in {model}: ")
    assert "\n" not in info.value.message
    # What went wrong, not where: the line was "Detected at node 'save/RestoreV2' defined at ...".
    assert "Detected at node" not in info.value.message
    assert info.value.message.endswith(("less bytes than requested", "corrupted", "truncated"))
