"""The per-call graph rewrites (``nlp._graph_rewrites``, applied by ``SessionRuntime``) are exact:
the rewritten graph gives the original's scores, and a pattern that does not qualify is left alone."""

import numpy as np
import pytest

from nlp import _graph_rewrites as rewrites
from nlp import engine
from nlp import runtime as runtime_module
from tests.nlp import session_runtime

SHAPES = [(1, 16), (2, 16), (4, 32), (1, 64)]


def _runtime(model_dir, *, rewrite=True, **kwargs):
    return session_runtime(model_dir, SHAPES, freeze=True, graph_rewrites=rewrite, **kwargs)


@pytest.fixture(scope="module")
def jittered_model_dir(make_model_dir):
    """A tiny GPLinker whose biases and LayerNorm gains are not 0 and 1 (as after training): with
    exact zeros and ones grappler drops the additions and products the rewrites match."""
    return make_model_dir("triples", seed=11, jitter_constants=True)


def _inputs(batch, length, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(104, 1000, size=(batch, length)).astype(np.int32)
    ids[:, 0] = 2
    for row, n in enumerate(rng.integers(3, length + 1, size=batch)):
        ids[row, n - 1] = 3
        ids[row, n:] = 0  # padding: the masked positions must stay -inf
    return ids


def _assert_same_scores(reference, rewritten):
    for i, shape in enumerate(SHAPES):
        ids = _inputs(*shape, seed=i)
        segments = np.zeros_like(ids)
        for a, b in zip(reference.run(ids, segments), rewritten.run(ids, segments), strict=True):
            assert a.shape == b.shape
            masked = ~np.isfinite(a)
            assert masked.any()
            np.testing.assert_array_equal(a[masked], b[masked])
            # fp32 rounding, relative to the scores' scale (the fused kernels sum in another order)
            scale = float(np.abs(a[~masked]).max())
            np.testing.assert_allclose(b[~masked], a[~masked], rtol=1e-5, atol=1e-5 * scale)


def test_rewritten_graph_gives_the_original_scores(jittered_model_dir):
    reference = _runtime(jittered_model_dir, rewrite=False)
    rewritten = _runtime(jittered_model_dir)
    # 2 layers: 2 attention masks + 3 pointer masks; 2 GELUs; embedding + 2 x 2 LayerNorms;
    # the head and tail pointers (the entity pointer's scores also feed its triangle mask).
    assert rewritten.rewrites["mask_without_broadcasts"] == 5
    assert rewritten.rewrites["mask_pointer_scores_once"] == 2
    assert rewritten.rewrites["rewrite_erf_gelus"] == 2
    # every Dense flattens its input with a constant shape: 6 per layer, 2 per pointer head
    assert rewritten.rewrites["flatten_dense_inputs"] == 2 * 6 + 3 * 2
    assert "fuse_sibling_dense" not in rewritten.rewrites  # opt-in: not faster (tf_graph)
    ops = [op.type for op in rewritten._graph.get_operations()]
    assert not {"BroadcastTo", "VarHandleOp", "ReadVariableOp"} & set(ops)
    if engine._onednn_layer_norm():
        assert rewritten.rewrites["rewrite_layer_norms"] == 5
        assert ops.count("_MklLayerNorm") == 5 and "DivNoNan" not in ops
    _assert_same_scores(reference, rewritten)


def test_rewrites_leave_the_default_test_model_exact(triples_model_dir):
    """Zero biases and unit gains (grappler simplifies those itself): still the same scores."""
    _assert_same_scores(
        _runtime(triples_model_dir, rewrite=False),
        _runtime(triples_model_dir),
    )


def test_rewrites_keep_the_demo_models_triples(monkeypatch):
    """The committed demo model decodes the same triples frozen and rewritten as from its variables
    (fp32 is served from its variables; int8 and bf16 are served frozen and rewritten)."""
    from pathlib import Path

    from nlp.pipeline import Extractor

    demo = Path(__file__).resolve().parents[2] / "models" / "demo"
    texts = [
        "《平凡的世界》是作家路遥创作的长篇小说，1986年由中国文联出版社出版。",
        "周杰伦，1979年1月18日出生于台湾省新北市，中国台湾流行乐男歌手。",
        "李白的妻子是许氏，他出生于西域碎叶城。",
        "北京大学创办于1898年，初名京师大学堂。",
    ]
    with monkeypatch.context() as patch:
        patch.setattr(runtime_module, "FROZEN_PRECISIONS", ("fp32",))
        rewritten = Extractor.load(demo, intra_op_threads=1, inter_op_threads=1)
    assert rewritten.runtime.rewrites.get("rewrite_erf_gelus")
    got = rewritten.extract_batch(texts)
    reference = Extractor.load(demo, intra_op_threads=1, inter_op_threads=1)
    assert not reference.runtime.frozen and not reference.runtime.rewrites
    assert reference.extract_batch(texts) == got


# -- pattern level: each rewrite on a small graph, and the cases it must not touch ------------


def _run(graph_def, feeds, fetch):
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(f"{fetch}:0", {f"{k}:0": v for k, v in feeds.items()})


def _ranks(graph):
    return {op.name: op.outputs[0].shape.rank for op in graph.get_operations() if op.outputs}


def _layer_norm_graph(epsilon):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None, 8], name="x")
        gamma = tf.constant(1.0 + rng.normal(0, 0.1, 8).astype(np.float32))
        beta = tf.constant(rng.normal(0, 0.1, 8).astype(np.float32))
        mean = tf.reduce_mean(x, -1, keepdims=True)
        centred = x - mean
        var = tf.reduce_mean(tf.square(centred), -1, keepdims=True)
        scaled = tf.math.divide_no_nan(centred, tf.sqrt(tf.maximum(var + epsilon, 0.0)))
        tf.identity(scaled * gamma + beta, name="out")
    return graph


@pytest.mark.skipif(not engine._onednn_layer_norm(), reason="no oneDNN layer norm here")
def test_layer_norm_rewrite_is_exact_and_keeps_epsilon():
    graph = _layer_norm_graph(1e-12)
    graph_def = graph.as_graph_def()
    x = np.random.default_rng(1).normal(0, 3, (2, 5, 8)).astype(np.float32)
    expected = _run(graph_def, {"x": x}, "out")
    assert rewrites.rewrite_layer_norms(graph_def, _ranks(graph)) == 1
    rewrites.prune(graph_def, ["out"])
    norms = [n for n in graph_def.node if n.op == "_MklLayerNorm"]
    assert len(norms) == 1 and norms[0].attr["epsilon"].f == pytest.approx(1e-12)
    assert not [n for n in graph_def.node if n.op in ("DivNoNan", "Sqrt")]
    np.testing.assert_allclose(_run(graph_def, {"x": x}, "out"), expected, rtol=1e-5, atol=1e-5)


def test_layer_norm_rewrite_needs_a_positive_epsilon():
    """With eps = 0 a constant row divides 0 by 0: divide_no_nan's answer, not the fused op's."""
    graph = _layer_norm_graph(0.0)
    graph_def = graph.as_graph_def()
    assert rewrites.rewrite_layer_norms(graph_def, _ranks(graph)) == 0


def _exact_gelu_out(y, *, extra_consumer):
    """``out``, the exact (erf) GELU of ``y``; with ``extra_consumer``, ``y`` is read once more
    (the dense output feeds something besides the GELU)."""
    import tensorflow as tf

    gelu = 0.5 * y * (1.0 + tf.math.erf(y / np.sqrt(2.0)))
    out = tf.identity(gelu, name="out")
    if extra_consumer:
        tf.identity(out + y, name="out")


def _dense_gelu_graph(extra_consumer):
    import tensorflow as tf

    rng = np.random.default_rng(2)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None, 6], name="x")
        w = tf.constant(rng.normal(0, 0.5, (6, 10)).astype(np.float32))
        b = tf.constant(rng.normal(0, 0.5, 10).astype(np.float32))
        flat = tf.reshape(tf.nn.bias_add(tf.matmul(tf.reshape(x, [-1, 6]), w), b), [-1, 3, 10])
        y = tf.identity(flat, name="y")
        _exact_gelu_out(y, extra_consumer=extra_consumer)
    return graph


def _rewritten_once(build, rewrite, *, seed, scale, shape):
    """``build``'s graph (no extra reader), a random input ``x`` of ``shape`` and the graph's output
    for it, then ``rewrite`` applied (it fires once) and the graph pruned to ``out``."""
    graph_def = build(extra_consumer=False).as_graph_def()
    x = np.random.default_rng(seed).normal(0, scale, shape).astype(np.float32)
    expected = _run(graph_def, {"x": x}, "out")
    assert rewrite(graph_def) == 1
    rewrites.prune(graph_def, ["out"])
    return graph_def, x, expected


def test_gelu_rewrite_is_exact():
    graph_def, x, expected = _rewritten_once(
        _dense_gelu_graph, rewrites.rewrite_erf_gelus, seed=3, scale=2, shape=(2, 3, 6)
    )
    assert not [n for n in graph_def.node if n.op == "RealDiv"]
    np.testing.assert_allclose(_run(graph_def, {"x": x}, "out"), expected, rtol=1e-5, atol=1e-6)


def test_gelu_rewrite_leaves_a_dense_output_read_elsewhere_alone():
    """Moving the GELU before the reshape would change what the other reader of ``y`` sees."""
    graph_def = _dense_gelu_graph(extra_consumer=True).as_graph_def()
    assert rewrites.rewrite_erf_gelus(graph_def) == 0


def _pointer_mask_graph():
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        logits = tf.compat.v1.placeholder(tf.float32, [None, None, None], name="logits")
        bias = tf.compat.v1.placeholder(tf.float32, [None, 4, None], name="bias")
        mask = tf.compat.v1.placeholder(tf.bool, [None, None], name="mask")
        scores = logits[:, None] + bias[:, ::2, None] + bias[:, 1::2, :, None]
        full = tf.logical_and(mask[:, None, :, None], mask[:, None, None, :])
        fill = tf.constant(-np.inf)
        # what tf-keras' ``K.where`` (bert4keras' sequence_masking) writes: explicit broadcasts
        shape = tf.raw_ops.BroadcastArgs(
            s0=tf.shape(full),
            s1=tf.raw_ops.BroadcastArgs(s0=tf.shape(scores), s1=tf.shape(fill)),
        )
        selected = tf.where(tf.broadcast_to(full, shape), scores, tf.broadcast_to(fill, shape))
        tf.identity(selected, name="out")
    return graph


def test_pointer_mask_rewrites_are_exact():
    graph_def = _pointer_mask_graph().as_graph_def()
    rng = np.random.default_rng(4)
    feeds = {
        "logits": rng.normal(size=(2, 5, 5)).astype(np.float32),
        "bias": rng.normal(size=(2, 4, 5)).astype(np.float32),
        "mask": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=bool),
    }
    expected = _run(graph_def, feeds, "out")
    assert rewrites.mask_without_broadcasts(graph_def) == 1
    rewrites.prune(graph_def, ["out"])
    assert rewrites.mask_pointer_scores_once(graph_def) == 1
    rewrites.prune(graph_def, ["out"])
    assert not [n for n in graph_def.node if n.op == "BroadcastTo"]
    np.testing.assert_array_equal(_run(graph_def, feeds, "out"), expected)


def test_pointer_mask_stays_when_the_fill_is_not_minus_infinity():
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [None, 1, 3, 3], name="a")
        b = tf.compat.v1.placeholder(tf.float32, [None, 2, 1, 3], name="b")
        mask = tf.compat.v1.placeholder(tf.bool, [None, 1, 3, 3], name="mask")
        tf.identity(tf.where(mask, a + b + b, 0.0), name="out")
    graph_def = graph.as_graph_def()
    rewrites.mask_without_broadcasts(graph_def)
    rewrites.prune(graph_def, ["out"])
    assert rewrites.mask_pointer_scores_once(graph_def) == 0


@pytest.mark.skipif(not engine._onednn_layer_norm(), reason="no oneDNN layer norm here")
def test_layer_norm_rewrite_reads_a_zero_written_without_values():
    """``spo quantize`` (Intel Neural Compressor) writes the LayerNorm's ``maximum(var + eps, 0)``
    zero as a tensor proto with no values, which TensorFlow reads as zeros."""
    graph = _layer_norm_graph(1e-12)
    graph_def = graph.as_graph_def()
    nodes = {n.name: n for n in graph_def.node}
    maximum = next(n for n in graph_def.node if n.op == "Maximum")
    zero = (
        next(nodes[name] for name in maximum.input if nodes[name].op == "Const")
        .attr["value"]
        .tensor
    )
    zero.ClearField("float_val")
    zero.ClearField("tensor_content")
    x = np.random.default_rng(1).normal(0, 3, (2, 5, 8)).astype(np.float32)
    expected = _run(graph_def, {"x": x}, "out")
    assert rewrites.rewrite_layer_norms(graph_def, _ranks(graph)) == 1
    rewrites.prune(graph_def, ["out"])
    np.testing.assert_allclose(_run(graph_def, {"x": x}, "out"), expected, rtol=1e-5, atol=1e-5)


def _quantized_dense_gelu_graph(extra_consumer):
    """An int8 Dense (``QuantizeV2`` MIN_FIRST + ``QuantizedMatMulWithBiasAndDequantize``, the ops
    ``spo quantize`` writes) on a 3-D input, then bert4keras' erf GELU."""
    import tensorflow as tf

    rng = np.random.default_rng(5)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None, 16], name="x")
        flat = tf.reshape(x, [-1, 16])
        low, high = tf.constant(-3.0), tf.constant(4.0)
        quantized, q_low, q_high = tf.raw_ops.QuantizeV2(
            input=flat, min_range=low, max_range=high, T=tf.quint8, mode="MIN_FIRST"
        )
        weights = tf.constant(rng.integers(-127, 128, (16, 24)).astype(np.int8), dtype=tf.qint8)
        bias = tf.constant(rng.integers(-5000, 5000, 24).astype(np.int32), dtype=tf.qint32)
        dense = tf.raw_ops.QuantizedMatMulWithBiasAndDequantize(
            a=quantized,
            b=weights,
            bias=bias,
            min_a=q_low,
            max_a=q_high,
            min_b=tf.constant(-0.5),
            max_b=tf.constant(0.5),
            min_freezed_output=tf.constant(-20.0),
            max_freezed_output=tf.constant(20.0),
            Toutput=tf.float32,
            input_quant_mode="MIN_FIRST",
        )
        y = tf.reshape(dense, [-1, 3, 24])
        _exact_gelu_out(y, extra_consumer=extra_consumer)
    return graph


@pytest.mark.skipif(engine.int8_support() is not None, reason="no oneDNN int8 here")
def test_quantized_gelu_fusion_is_exact():
    graph_def, x, expected = _rewritten_once(
        _quantized_dense_gelu_graph,
        rewrites.fuse_quantized_gelus,
        seed=6,
        scale=1.5,
        shape=(4, 3, 16),
    )
    ops = [n.op for n in graph_def.node]
    assert "_QuantizedMatMul" in ops and "Erf" not in ops
    assert rewrites.QUANTIZED_MATMUL not in ops
    fused = next(n for n in graph_def.node if n.op == "_QuantizedMatMul")
    assert list(fused.attr["fused_ops"].list.s) == [b"BiasAdd", b"GeluExact", b"Dequantize"]
    got = _run(graph_def, {"x": x}, "out")
    assert np.abs(expected).max() > 1.0  # the GELU saw values on both sides of 0
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_quantized_gelu_fusion_leaves_a_dense_output_read_elsewhere_alone():
    graph_def = _quantized_dense_gelu_graph(extra_consumer=True).as_graph_def()
    assert rewrites.fuse_quantized_gelus(graph_def) == 0
    assert rewrites.QUANTIZED_MATMUL in [n.op for n in graph_def.node]


def _dense_on_3d_graph():
    """What a Keras Dense writes for a 3-D input: ``tf.tensordot`` with its runtime shape maths."""
    import tensorflow as tf

    rng = np.random.default_rng(7)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None, 6], name="x")
        w = tf.constant(rng.normal(0, 0.5, (6, 4)).astype(np.float32))
        tf.identity(tf.tensordot(x, w, [[2], [0]]), name="out")
    return graph


def _dims(graph):
    return {
        op.name: op.outputs[0].shape.as_list() if op.outputs[0].shape.rank is not None else None
        for op in graph.get_operations()
        if op.outputs
    }


def test_dense_input_flattening_is_exact_and_drops_the_shape_maths():
    graph = _dense_on_3d_graph()
    graph_def = graph.as_graph_def()
    before = len(graph_def.node)
    feeds = [
        np.random.default_rng(8).normal(size=s).astype(np.float32) for s in [(2, 5, 6), (1, 3, 6)]
    ]
    expected = [_run(graph_def, {"x": x}, "out") for x in feeds]
    assert rewrites.flatten_dense_inputs(graph_def, _dims(graph)) == 1
    rewrites.prune(graph_def, ["out"])
    assert len(graph_def.node) <= before - 3  # Pack and the contracted dims' Gather + Prod at least
    flat = [n for n in graph_def.node if n.name.endswith("/flat_shape")]
    assert len(flat) == 1 and list(flat[0].attr["value"].tensor.int_val) == [-1, 6]
    for x, want in zip(feeds, expected, strict=True):
        np.testing.assert_array_equal(_run(graph_def, {"x": x}, "out"), want)


def test_dense_input_flattening_needs_the_contracted_dims_static():
    graph = _dense_on_3d_graph()
    graph_def = graph.as_graph_def()
    dims = {
        name: None if shape is None else [None] * len(shape) for name, shape in _dims(graph).items()
    }
    assert rewrites.flatten_dense_inputs(graph_def, dims) == 0


def test_fuse_sibling_dense_runs_one_matmul_for_q_k_v(jittered_model_dir):
    """Issue 24: Q, K and V as one matmul per layer; fewer MatMuls, the same scores, weights once."""
    import tensorflow as tf

    from nlp.tf_graph import frozen_graph_def

    reference = _runtime(jittered_model_dir, rewrite=False)
    rewritten = _runtime(jittered_model_dir, extra_rewrites=("fuse_sibling_dense",))
    # Q, K and V per layer; the three pointer heads' first Dense read the same encoder output
    assert rewritten.rewrites["fuse_sibling_dense"] == 2 + 1
    before = [op.type for op in reference._graph.get_operations()]
    after = [op.type for op in rewritten._graph.get_operations()]
    # 2 layers x (3 -> 1) and the pointer heads' 3 -> 1
    assert after.count("MatMul") == before.count("MatMul") - 2 * 2 - 2
    assert after.count("SplitV") == 3
    assert len(after) < len(before)

    def const_bytes(graph):
        return sum(
            len(op.get_attr("value").tensor_content)
            for op in graph.get_operations()
            if op.type == "Const"
        )

    assert const_bytes(rewritten._graph) <= const_bytes(reference._graph)  # weights held once
    _assert_same_scores(reference, rewritten)
    # applied again, it finds nothing left to fuse (and changes nothing)
    graph_def = rewritten._graph.as_graph_def()
    copy = tf.compat.v1.GraphDef()
    copy.CopyFrom(graph_def)
    assert rewrites.fuse_sibling_dense(copy) == 0 and copy == graph_def
    with pytest.raises(ValueError, match="unknown graph rewrites"):
        frozen_graph_def(None, None, [], extra_rewrites=("no_such_rewrite",))
    reference.close()
    rewritten.close()


def test_fuse_sibling_dense_leaves_unequal_inputs_alone():
    """Two Dense layers over different inputs are not siblings: nothing changes."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [None, 4], name="a")
        b = tf.compat.v1.placeholder(tf.float32, [None, 4], name="b")
        w = tf.constant(np.ones((4, 3), np.float32))
        bias = tf.constant(np.arange(3, dtype=np.float32))
        tf.nn.bias_add(tf.matmul(a, w), bias, name="ya")
        tf.nn.bias_add(tf.matmul(b, w), bias, name="yb")
    graph_def = graph.as_graph_def()
    copy = tf.compat.v1.GraphDef()
    copy.CopyFrom(graph_def)
    assert rewrites.fuse_sibling_dense(copy) == 0 and copy == graph_def


def test_fuse_sibling_dense_gives_each_dense_its_own_columns():
    """Three Dense layers over one input: one MatMul, a SplitV, and each output as before."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
        for i, width in enumerate((8, 8, 5)):
            w = tf.constant(rng.normal(size=(8, width)).astype(np.float32))
            b = tf.constant(rng.normal(size=width).astype(np.float32))
            tf.nn.bias_add(tf.matmul(tf.reshape(x, [-1, 8]), w), b, name=f"y{i}")
    graph_def = graph.as_graph_def()
    feed = rng.normal(size=(3, 8)).astype(np.float32)
    fetches = ["y0:0", "y1:0", "y2:0"]

    def run(gd):
        g = tf.Graph()
        with g.as_default():
            tf.import_graph_def(gd, name="")
        with tf.compat.v1.Session(graph=g) as session:
            ops = [op.type for op in g.get_operations()]
            return session.run(fetches, {"x:0": feed}), ops

    expected, ops_before = run(graph_def)
    assert rewrites.fuse_sibling_dense(graph_def) == 1
    rewrites.prune(graph_def, fetches)
    got, ops_after = run(graph_def)
    assert ops_before.count("MatMul") == 3 and ops_after.count("MatMul") == 1
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


def _two_quantized_dense_graph(extra_consumer, *, mode="MIN_FIRST", ffn_low=-0.2):
    """``spo quantize``'s FFN: an int8 Dense + erf GELU, whose output a second int8 Dense reads
    through the ``tf.tensordot`` flattening (identity transpose, reshape) and a ``QuantizeV2`` over
    its calibrated constant range (``ffn_low`` to 3.0, u8 ``mode``); with ``extra_consumer`` the
    GELU's float output is read once more."""
    import tensorflow as tf

    rng = np.random.default_rng(8)

    def quantized_dense(flat, low, high, columns, mode):
        quantized, q_low, q_high = tf.raw_ops.QuantizeV2(
            input=flat, min_range=tf.constant(low), max_range=tf.constant(high), T=tf.quint8,
            mode=mode,
        )  # fmt: skip
        rows = int(flat.shape[-1])
        weights = rng.integers(-127, 128, (rows, columns)).astype(np.int8)
        return tf.raw_ops.QuantizedMatMulWithBiasAndDequantize(
            a=quantized,
            b=tf.constant(weights, dtype=tf.qint8),
            bias=tf.constant(rng.integers(-5000, 5000, columns).astype(np.int32), tf.qint32),
            min_a=q_low,
            max_a=q_high,
            min_b=tf.constant(-0.05),
            max_b=tf.constant(0.05),
            min_freezed_output=tf.constant(-20.0),
            max_freezed_output=tf.constant(20.0),
            Toutput=tf.float32,
            input_quant_mode=mode,
        )

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None, 16], name="x")
        first = quantized_dense(tf.reshape(x, [-1, 16]), -3.0, 4.0, 24, "MIN_FIRST")
        y = tf.reshape(first, [-1, 3, 24])
        gelu = tf.identity(0.5 * y * (1.0 + tf.math.erf(y / np.sqrt(2.0))), name="gelu")
        if extra_consumer:
            tf.identity(gelu * 2.0, name="also")
        moved = tf.transpose(gelu, tf.concat([[0, 1], [2]], 0))  # how tensordot writes it
        second = quantized_dense(tf.reshape(moved, [-1, 24]), ffn_low, 3.0, 8, mode)
        tf.identity(tf.reshape(second, tf.concat([tf.shape(gelu)[:2], [8]], 0)), name="out")
    return graph


@pytest.mark.skipif(engine.int8_support() is not None, reason="no oneDNN int8 here")
def test_chained_quantized_dense_is_exact_up_to_one_step():
    graph_def = _two_quantized_dense_graph(extra_consumer=False).as_graph_def()
    x = np.random.default_rng(9).normal(0, 1.5, (5, 3, 16)).astype(np.float32)
    expected = _run(graph_def, {"x": x}, "out")
    assert rewrites.fuse_quantized_gelus(graph_def) == 1
    rewrites.prune(graph_def, ["out"])
    fused = _run(graph_def, {"x": x}, "out")
    assert rewrites.chain_quantized_dense(graph_def) == 1
    rewrites.prune(graph_def, ["out"])
    ops = [n.op for n in graph_def.node]
    assert ops.count("QuantizeV2") == 1  # the first Dense's input only
    chained = next(n for n in graph_def.node if n.op == "_QuantizedMatMul")
    assert list(chained.attr["fused_ops"].list.s) == [b"BiasAdd", b"GeluExact", b"Requantize"]
    got = _run(graph_def, {"x": x}, "out")
    assert got.shape == expected.shape == (5, 3, 8)
    # One u8 step of the second Dense's input (3.2 / 255) times its weights' column sums bounds
    # what a value rounded the other way can change; most land exactly where QuantizeV2 put them.
    bound = 3.2 / 255 * 127 * 24 * 0.05 / 127
    np.testing.assert_allclose(got, fused, rtol=0, atol=bound)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=bound)
    assert np.mean(got == fused) > 0.9


@pytest.mark.parametrize(
    "graph_kwargs",
    [
        {"extra_consumer": True},  # the float GELU output is needed anyway
        {"extra_consumer": False, "mode": "SCALED"},  # not the u8 MIN_FIRST requantize writes
        {"extra_consumer": False, "ffn_low": 0.5},  # QuantizeV2 would widen the range to 0
    ],
)
def test_chained_quantized_dense_leaves_other_patterns_alone(graph_kwargs):
    graph_def = _two_quantized_dense_graph(**graph_kwargs).as_graph_def()
    assert rewrites.fuse_quantized_gelus(graph_def) == 1
    before = graph_def.SerializeToString(deterministic=True)
    assert rewrites.chain_quantized_dense(graph_def) == 0
    assert graph_def.SerializeToString(deterministic=True) == before


@pytest.mark.skipif(engine.int8_support() is not None, reason="no oneDNN int8 here")
def test_int8_graphs_are_chained_by_default():
    from nlp import tf_graph

    graph_def = _two_quantized_dense_graph(extra_consumer=False).as_graph_def()
    counts = tf_graph._rewrite(graph_def, ["out:0"], {})
    assert counts["fuse_quantized_gelus"] == counts["chain_quantized_dense"] == 1
    assert [n.op for n in graph_def.node].count("QuantizeV2") == 1


def test_chained_quantized_dense_needs_a_fusion_the_kernel_can_requantize():
    graph_def = _two_quantized_dense_graph(extra_consumer=False).as_graph_def()
    assert rewrites.fuse_quantized_gelus(graph_def) == 1
    fused = next(n for n in graph_def.node if n.op == "_QuantizedMatMul")
    fused.attr["fused_ops"].list.s[1] = b"Add"  # BiasAdd, Add, Dequantize: no Requantize form
    assert rewrites.chain_quantized_dense(graph_def) == 0
