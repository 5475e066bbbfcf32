"""The TensorFlow graph transformations ``nlp.runtime`` applies before it serves a frozen graph.

``frozen_graph_def``: the loaded graph with its variables turned into constants, every Keras
``Dense`` bias-add moved before its output reshape (``_fold_bias_adds``) and, unless asked not to,
the exact per-call rewrites of ``nlp._graph_rewrites`` (those that need oneDNN only where this
process runs it: ``nlp.engine``'s probes). ``freeze_graph_def`` is the freezing alone, for offline
tools (``spo quantize``). ``lookup_table`` and ``position_table`` read the sizes the runtime checks
against the vocab and ``max_length`` before warm-up. Imported by ``nlp.runtime`` (and the offline
tools) only: with it, this is where ``nlp`` touches TensorFlow's graphs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from nlp import _graph_rewrites, engine, quiet_tensorflow

with quiet_tensorflow():
    import tensorflow as tf

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def quiet_tf_logger() -> Iterator[None]:
    """Hide TensorFlow's deprecation warnings for the duration (they name APIs we chose on purpose)."""
    tf_logger = tf.get_logger()
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        tf_logger.setLevel(level)


def _fold_bias_adds(graph_def: Any) -> int:
    """Rewrite ``MatMul -> Reshape -> BiasAdd`` (Keras ``Dense`` on a 3-D input, via ``tensordot``) as
    ``MatMul -> BiasAdd -> Reshape``, in place; returns how many were rewritten.

    Exact: the bias is added along the last axis, which the reshape keeps (``BiasAdd`` needs the bias
    length to equal that axis, and it equals the matmul's column count, checked from the constant
    weight). Adjacent ``MatMul`` + ``BiasAdd`` is what grappler's remapper fuses into one oneDNN op.
    """
    nodes = {n.name: n for n in graph_def.node}
    consumers: dict[str, int] = {}
    for n in graph_def.node:
        for name in n.input:
            key = name.lstrip("^").split(":")[0]
            consumers[key] = consumers.get(key, 0) + 1

    def const_shape(name: str) -> list[int] | None:
        node = nodes.get(name.split(":")[0])
        while node is not None and node.op == "Identity":
            node = nodes.get(node.input[0].split(":")[0])
        if node is None or node.op != "Const":
            return None
        return [d.size for d in node.attr["value"].tensor.tensor_shape.dim]

    added = []
    for node in graph_def.node:
        if node.op != "BiasAdd" or node.attr["data_format"].s not in (b"", b"NHWC"):
            continue
        reshape = nodes.get(node.input[0].split(":")[0])
        if reshape is None or reshape.op != "Reshape" or consumers.get(reshape.name) != 1:
            continue
        matmul = nodes.get(reshape.input[0].split(":")[0])
        if matmul is None or matmul.op != "MatMul" or consumers.get(matmul.name) != 1:
            continue
        weight, bias = const_shape(matmul.input[1]), const_shape(node.input[1])
        if weight is None or bias is None or len(weight) != 2 or len(bias) != 1:
            continue
        columns = weight[0] if matmul.attr["transpose_b"].b else weight[1]
        if columns != bias[0]:
            continue
        fused = type(node)()
        fused.CopyFrom(node)
        fused.name = f"{node.name}/before_reshape"
        fused.input[0] = matmul.name
        added.append(fused)
        reshape.input[0] = fused.name
        # The old BiasAdd becomes an Identity of the reshape, so its consumers are untouched.
        dtype = node.attr["T"]
        node.op = "Identity"
        del node.input[1:]
        node.input[0] = reshape.name
        node.ClearField("attr")
        node.attr["T"].CopyFrom(dtype)
    graph_def.node.extend(added)
    return len(added)


def _freeze(session: Any, graph: Any, output_names: Sequence[str]) -> Any:
    """The loaded graph with its variables turned into constants and bias-adds folded (a GraphDef).

    Used for ``bf16``: grappler's mixed-precision rewrite casts every weight to bf16 on every run when
    weights are variables (a fifth of a batch-8 run on RBT6); as constants the casts are folded once
    when the session first runs a shape.
    """
    op_names = sorted({name.split(":")[0] for name in output_names})
    with quiet_tf_logger():
        graph_def = tf.compat.v1.graph_util.convert_variables_to_constants(
            session, graph.as_graph_def(), op_names
        )
    folded = _fold_bias_adds(graph_def)
    logger.debug("variables frozen into constants; %d bias-adds folded before reshapes", folded)
    return graph_def


# Exact rewrites that are not applied unless asked for (``extra_rewrites``), with why.
# ``fuse_sibling_dense`` (Q, K and V as one matmul): on RBT6 (AMD EPYC, 2 shared cores) it was no
# faster: interleaved medians before -> after, bf16 1x128 78.6 -> 82.1 ms, 8x128 726 -> 752 ms, fp32
# 1x16 30.8 -> 35.1 ms; traced, the SplitV that gives Q, K and V back costs 30 ms of a 774 ms
# bf16 8x128 call and the one wider oneDNN matmul took no less time than the three.
OPT_IN_REWRITES = ("fuse_sibling_dense",)


def check_extra_rewrites(names: Collection[str]) -> None:
    """ValueError unless every name is one of ``OPT_IN_REWRITES``."""
    unknown = set(names) - set(OPT_IN_REWRITES)
    if unknown:
        raise ValueError(f"unknown graph rewrites {sorted(unknown)}; known: {OPT_IN_REWRITES}")


def _rewrite(
    graph_def: Any,
    output_names: Sequence[str],
    dims: dict[str, list[int | None] | None],
    extra_rewrites: Collection[str] = (),
) -> dict[str, int]:
    """Apply the exact per-call rewrites of ``nlp._graph_rewrites`` to a frozen, bias-folded graph,
    in place; returns how many places each rewrote.

    Order matters: sibling Dense layers (Q, K, V) are fused once their input flattening is one
    constant shape (then their three inputs compare equal); the pointer heads' mask moves before their bias terms only once its
    ``BroadcastTo`` copies are gone, and the GELU pattern needs the bias-add before the reshape;
    an int8 FFN passes u8 from its first Dense to its second once the GELU is fused into the first.
    Nodes nothing reads any more are pruned between steps. ``dims``: each node's static output
    shape (None where the rank is unknown), from the graph as loaded.
    """
    rewrites = _graph_rewrites
    ranks = {name: None if shape is None else len(shape) for name, shape in dims.items()}
    counts = {"pruned": rewrites.prune(graph_def, output_names)}
    steps: list[tuple[str, Callable[[Any], int]]] = [
        ("flatten_dense_inputs", lambda g: rewrites.flatten_dense_inputs(g, dims)),
        ("mask_without_broadcasts", rewrites.mask_without_broadcasts),
        ("mask_pointer_scores_once", rewrites.mask_pointer_scores_once),
        ("rewrite_erf_gelus", rewrites.rewrite_erf_gelus),
    ]
    if "fuse_sibling_dense" in extra_rewrites:  # after the flattening, see OPT_IN_REWRITES
        steps.insert(1, ("fuse_sibling_dense", rewrites.fuse_sibling_dense))
    if engine._onednn_layer_norm():
        steps.append(("rewrite_layer_norms", lambda g: rewrites.rewrite_layer_norms(g, ranks)))
    if engine._onednn_enabled():  # int8 graphs only: their quantized ops have oneDNN kernels alone
        steps.append(("fuse_quantized_gelus", rewrites.fuse_quantized_gelus))
        steps.append(("chain_quantized_dense", rewrites.chain_quantized_dense))
    for name, step in steps:
        counts[name] = step(graph_def)
        counts["pruned"] += rewrites.prune(graph_def, output_names)
    return counts


def freeze_graph_def(session: Any, graph: Any, output_names: Sequence[str]) -> Any:
    """The graph ``SessionRuntime`` runs for bf16 (``_freeze``), for offline tools (``spo quantize``)."""
    return _freeze(session, graph, output_names)


def frozen_graph_def(
    session: Any,
    graph: Any,
    output_names: Sequence[str],
    *,
    graph_rewrites: bool = True,
    extra_rewrites: Collection[str] = (),
) -> tuple[Any, dict[str, int]]:
    """``graph`` (loaded in ``session``) frozen and bias-folded, rewritten unless ``graph_rewrites``
    is False (and by ``extra_rewrites`` too, names from ``OPT_IN_REWRITES``); and how many places
    each rewrite changed (empty without rewrites). Raises TensorFlow's errors for a graph that
    cannot be frozen (a TF2 export, whose layers read resource variables)."""
    check_extra_rewrites(extra_rewrites)
    graph_def = _freeze(session, graph, output_names)
    if not graph_rewrites:
        return graph_def, {}
    dims = {
        op.name: op.outputs[0].shape.as_list() if op.outputs[0].shape.rank is not None else None
        for op in graph.get_operations()
        if op.outputs
    }
    return graph_def, _rewrite(graph_def, output_names, dims, extra_rewrites)


# -- static facts, read before warm-up ----------------------------------------------------------
# Ops a lookup's ids pass through unchanged on their way to the table (bert4keras casts them).
_PASS_THROUGH = frozenset({"Cast", "Identity"})
_GATHERS = frozenset({"ResourceGather", "GatherV2", "Gather"})
# bert4keras's BERT position embeddings (absolute, one row per position); other encoders have none.
POSITION_TABLE = "Embedding-Position/embeddings"
# bert4keras's token embeddings: what the token ids index, found by name where no gather shows it.
TOKEN_TABLE = "Embedding-Token/embeddings"


def _rows(table: Any) -> int | None:
    """Axis 0 of a table (a resource variable's: its handle's declared shape); None if unknown."""
    if table.dtype == tf.resource:
        if table.op.type != "VarHandleOp":
            return None
        shape = tf.TensorShape(table.op.get_attr("shape"))
    else:
        shape = table.shape
    rows: int | None = shape[0] if shape.rank else None
    return rows


def lookup_table(ids: Any) -> tuple[str, int] | None:
    """``(name, rows)`` of the table that the tensor ``ids`` index: the first gather reached from
    it through casts; where the graph does not show one (a TF2 export's is in a function),
    bert4keras's token embeddings (``TOKEN_TABLE``); None where there is neither."""
    pending, seen = [ids], set()
    while pending:
        tensor = pending.pop()
        for op in tensor.consumers():
            if op.type in _GATHERS and op.inputs[1].name == tensor.name:
                rows = _rows(op.inputs[0])
                return None if rows is None else (op.inputs[0].op.name, rows)
            if op.type in _PASS_THROUGH and op.name not in seen:
                seen.add(op.name)
                pending.extend(op.outputs)
    return _named_table(ids.graph, TOKEN_TABLE)


def _named_table(graph: Any, name: str) -> tuple[str, int] | None:
    try:
        op = graph.get_operation_by_name(name)
    except (KeyError, ValueError):
        return None
    rows = _rows(op.outputs[0])
    return None if rows is None else (name, rows)


def position_table(graph: Any) -> tuple[str, int] | None:
    """``(name, rows)`` of the graph's position embeddings (bert4keras's ``POSITION_TABLE``): the
    longest input it can embed; None where it has none or its size is not static."""
    return _named_table(graph, POSITION_TABLE)


def max_length_problem(graph: Any, longest: int, model_dir: Any) -> str | None:
    """Why inputs of ``longest`` tokens do not fit the graph's position embeddings (None: they do,
    or the graph has none that ``position_table`` can read)."""
    table = position_table(graph)
    if table is None or longest <= table[1]:
        return None
    name, rows = table
    return (
        f"{model_dir}: model.json's max_length {longest} is more than the {rows} positions of "
        f"the model's position embeddings ({name}): set max_length, and the last of "
        f"length_buckets, to at most {rows}"
    )
