"""The one stateful stage: a TF ``compat.v1`` Session over its own graph, fed numpy, returning numpy.

Why not ``tf.saved_model.load`` and eager calls: every new input shape traces a new graph and grows a
kernel cache that is never freed, so process memory climbs with every unseen length. Here the SavedModel
is loaded once into a private ``tf.Graph`` (for ``bf16`` and ``int8``, frozen and rewritten: see
``FROZEN_PRECISIONS``); each shape from the fixed bucket list is run once at
start-up with full-size inputs (so every allocation size the request path needs has been made); then
the graph is finalized, so any code that would add a node raises instead of leaking. Nothing on the
request path creates a tensor or runs eagerly: ``run`` is one ``Session.run`` over numpy feeds.

This is the only module in ``nlp`` that imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy.typing as npt

from nlp import quiet_tensorflow

with quiet_tensorflow():
    import tensorflow as tf

from nlp import _graph_rewrites
from nlp.config import DEFAULT_PRECISION, PRECISIONS, LoadOptions
from nlp.errors import ModelLoadError, UnsupportedPrecision
from nlp.manifest import Manifest
from nlp.protocols import WarmedShapes

logger = logging.getLogger(__name__)

SIGNATURE = "serving_default"


def cpu_supports_bf16() -> bool:
    """Whether this CPU has native bf16 matmul (AVX-512 BF16 or AMX-BF16), read from /proc/cpuinfo."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    words = set(flags.split())
    return "avx512_bf16" in words or "amx_bf16" in words


# CPU flags of int8 dot-product instructions. Without them oneDNN multiplies u8 x s8 with
# ``vpmaddubsw``, whose 16-bit intermediate sums saturate: results drift, and it is no faster.
INT8_CPU_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def _cpu_flags() -> set[str]:
    try:
        return set(Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").split())
    except OSError:
        return set()


def _onednn_enabled() -> bool:
    """Whether TensorFlow runs oneDNN kernels in this process (built with oneDNN and not switched
    off with ``TF_ENABLE_ONEDNN_OPTS=0``; TensorFlow itself reads that variable)."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return False


def int8_support() -> str | None:
    """``None`` if this process can run an int8 model, else the reason it cannot (for the error).

    Quantized ops (``QuantizeV2``, ``QuantizedMatMulWithBiasAndDequantize``) have only oneDNN
    kernels on CPU, and are worth running only with int8 dot-product instructions.
    """
    if not _onednn_enabled():
        return (
            "TensorFlow runs without oneDNN here (a build without it, or TF_ENABLE_ONEDNN_OPTS=0), "
            "and quantized ops have no other CPU kernels"
        )
    if not _cpu_flags() & set(INT8_CPU_FLAGS):
        return (
            f"this CPU has no int8 dot-product instructions ({', '.join(INT8_CPU_FLAGS)} in "
            "/proc/cpuinfo)"
        )
    return None


@contextlib.contextmanager
def _quiet_tf_logger() -> Iterator[None]:
    """Hide TensorFlow's deprecation warnings for the duration (they name APIs we chose on purpose)."""
    tf_logger = tf.get_logger()
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        tf_logger.setLevel(level)


def _session_config(
    intra_op_threads: int | None, inter_op_threads: int | None, precision: str
) -> Any:
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=intra_op_threads or 0,
        inter_op_parallelism_threads=inter_op_threads or 0,
        allow_soft_placement=True,
    )
    if precision == "bf16":
        from tensorflow.core.protobuf import rewriter_config_pb2

        config.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = (
            rewriter_config_pb2.RewriterConfig.ON
        )
    return config


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
    with _quiet_tf_logger():
        graph_def = tf.compat.v1.graph_util.convert_variables_to_constants(
            session, graph.as_graph_def(), op_names
        )
    folded = _fold_bias_adds(graph_def)
    logger.debug("variables frozen into constants; %d bias-adds folded before reshapes", folded)
    return graph_def


# Precisions served from a frozen, rewritten graph (``_freeze``, ``_rewrite``). bf16 must be: with
# variables, grappler casts every weight to bf16 on every run. int8 frozen runs short calls 1.5-1.8x
# faster than fp32, from its variables only 1.07x (RBT6, BENCHMARKS.md). fp32 is served from its variables: frozen, the RBT6 benchmark
# model measured 1.1 GiB more RSS per worker (2,886 vs 1,792 MiB with the 74 default shapes), a 13 s
# longer cold start, and 9% fewer texts/s over the single-text workload (faster at 16-32 tokens,
# slower from 128); BENCHMARKS.md, "Freezing fp32".
FROZEN_PRECISIONS = ("bf16", "int8")


def _onednn_layer_norm() -> bool:
    """Whether this process runs oneDNN kernels and has the ``_MklLayerNorm`` op (TensorFlow's x86
    builds, unless ``TF_ENABLE_ONEDNN_OPTS=0``)."""
    try:
        from tensorflow.python.framework import op_def_registry
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled()) and (
            op_def_registry.get("_MklLayerNorm") is not None
        )
    except (ImportError, AttributeError):
        return False


def _rewrite(
    graph_def: Any, output_names: Sequence[str], dims: dict[str, list[int | None] | None]
) -> dict[str, int]:
    """Apply the exact per-call rewrites of ``nlp._graph_rewrites`` to a frozen, bias-folded graph,
    in place; returns how many places each rewrote.

    Order matters: the pointer heads' mask moves before their bias terms only once its
    ``BroadcastTo`` copies are gone, and the GELU pattern needs the bias-add before the reshape.
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
    if _onednn_layer_norm():
        steps.append(("rewrite_layer_norms", lambda g: rewrites.rewrite_layer_norms(g, ranks)))
    if _onednn_enabled():  # int8 graphs only: their quantized ops have oneDNN kernels alone
        steps.append(("fuse_quantized_gelus", rewrites.fuse_quantized_gelus))
    for name, step in steps:
        counts[name] = step(graph_def)
        counts["pruned"] += rewrites.prune(graph_def, output_names)
    return counts


def freeze_graph_def(session: Any, graph: Any, output_names: Sequence[str]) -> Any:
    """The graph ``SessionRuntime`` runs for bf16 (``_freeze``), for offline tools (``spo quantize``)."""
    return _freeze(session, graph, output_names)


def _release_free_heap() -> None:
    """Hand glibc's free heap pages back to the OS after loading (a no-op under other allocators).

    Loading, freezing and warming free several copies of the weights; without this, RSS stays at
    the load-time peak although the memory is unused (bf16 on RBT6: 3.5 GiB -> 1.7 GiB).
    """
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).malloc_trim(0)


class SessionRuntime(WarmedShapes):
    """A loaded, warmed, finalized SavedModel. ``run`` accepts only the shapes it was warmed on."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        shapes: Iterable[tuple[int, int]],
        input_names: tuple[str, str] | None = None,
        output_names: Sequence[str] | None = None,
        n_outputs: int,
        vocab_size: int,
        intra_op_threads: int | None = None,
        inter_op_threads: int | None = None,
        precision: str = DEFAULT_PRECISION,
        seed: int = 0,
        freeze: bool | None = None,
        graph_rewrites: bool = True,
    ) -> None:
        """``freeze``: serve a frozen, rewritten graph (default: for ``FROZEN_PRECISIONS``);
        ``graph_rewrites=False`` freezes without rewriting. Both are for tests and ``bench``."""
        if precision not in PRECISIONS:
            raise UnsupportedPrecision(
                f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
            )
        if precision == "bf16" and not cpu_supports_bf16():
            raise UnsupportedPrecision(
                "precision bf16 needs a CPU with AVX-512 BF16 or AMX (avx512_bf16 / amx_bf16 in "
                "/proc/cpuinfo); this one has neither: use fp32"
            )
        if precision == "int8" and (reason := int8_support()) is not None:
            raise UnsupportedPrecision(
                f"precision int8 cannot run here: {reason}; serve the fp32 model instead"
            )
        self.model_dir = Path(model_dir)
        self.precision = precision
        self.shapes: frozenset[tuple[int, int]] = frozenset(shapes)
        self.shapes_fed: set[tuple[int, int]] = set()
        self.runs = 0
        self.frozen = False
        self.rewrites: dict[str, int] = {}
        self._graph = tf.Graph()
        with quiet_tensorflow():  # the first session probes for CUDA devices
            self._session = tf.compat.v1.Session(
                graph=self._graph,
                config=_session_config(intra_op_threads, inter_op_threads, precision),
            )
        started = time.perf_counter()
        try:
            with self._graph.as_default(), _quiet_tf_logger():
                # The v1 loader is deprecated in favour of tf.saved_model.load, whose eager
                # per-shape tracing is exactly what this runtime exists to avoid.
                meta = tf.compat.v1.saved_model.loader.load(
                    self._session, ["serve"], str(self.model_dir)
                )
            self._inputs, self._outputs = self._resolve(meta, input_names, output_names, n_outputs)
            if precision in FROZEN_PRECISIONS if freeze is None else freeze:
                self._reload_frozen(intra_op_threads, inter_op_threads, precision, graph_rewrites)
        except ModelLoadError:
            self._session.close()
            raise
        except Exception as exc:  # TensorFlow raises many types for a bad SavedModel
            self._session.close()
            raise ModelLoadError(f"cannot load the SavedModel in {self.model_dir}: {exc}") from exc
        self.input_dtypes = tuple(t.dtype.as_numpy_dtype for t in self._inputs)
        self.load_seconds = time.perf_counter() - started
        started = time.perf_counter()
        self._warm(vocab_size, seed)
        self._graph.finalize()
        _release_free_heap()
        self.warm_seconds = time.perf_counter() - started
        self.op_count = len(self._graph.get_operations())
        logger.info(
            "model loaded from %s: %d ops, %d shapes warmed, load %.1fs, warm-up %.1fs, %s",
            self.model_dir,
            self.op_count,
            len(self.shapes),
            self.load_seconds,
            self.warm_seconds,
            precision,
        )

    @classmethod
    def for_model(
        cls,
        manifest: Manifest,
        options: LoadOptions,
        *,
        shapes: Iterable[tuple[int, int]],
        vocab_size: int,
    ) -> SessionRuntime:
        """The runtime of ``manifest``'s directory, with the threads and precision of ``options``,
        warmed on ``shapes``."""
        return cls(
            manifest.directory,
            shapes=shapes,
            input_names=manifest.input_names,
            output_names=manifest.output_names,
            n_outputs=manifest.n_outputs,
            vocab_size=vocab_size,
            intra_op_threads=options.intra_op_threads,
            inter_op_threads=options.inter_op_threads,
            precision=options.precision,
        )

    # -- loading -------------------------------------------------------------------------------
    def _tensor(self, name: str, field: str) -> Any:
        try:
            return self._graph.get_tensor_by_name(name)
        except (KeyError, ValueError) as exc:
            raise ModelLoadError(
                f"{field}: tensor {name!r} is not in the graph of {self.model_dir}", field=field
            ) from exc

    def _resolve(
        self,
        meta: Any,
        input_names: tuple[str, str] | None,
        output_names: Sequence[str] | None,
        n_outputs: int,
    ) -> tuple[list[Any], list[Any]]:
        signature = meta.signature_def.get(SIGNATURE)
        if input_names is None:
            if signature is None:
                raise ModelLoadError(
                    f"{self.model_dir}: model.json names no input tensors and the SavedModel has no "
                    f"'{SIGNATURE}' signature",
                    field="inputs",
                )
            keys = sorted(signature.inputs)
            if len(keys) != 2:
                raise ModelLoadError(
                    f"'{SIGNATURE}' has {len(keys)} inputs {keys}; expected token and segment ids",
                    field="inputs",
                )
            token_key = next((k for k in keys if "token" in k.lower()), keys[0])
            segment_key = next(k for k in keys if k != token_key)
            input_names = (signature.inputs[token_key].name, signature.inputs[segment_key].name)
        if output_names is None:
            if signature is None:
                raise ModelLoadError(
                    f"{self.model_dir}: model.json names no output tensors and the SavedModel has no "
                    f"'{SIGNATURE}' signature",
                    field="outputs",
                )
            # TensorFlow flattens a dict of outputs by sorted key; that order is the role order.
            output_names = [signature.outputs[k].name for k in sorted(signature.outputs)]
        if len(output_names) != n_outputs:
            raise ModelLoadError(
                f"the model has {len(output_names)} outputs, the task needs {n_outputs}",
                field="outputs",
            )
        inputs = [self._tensor(n, f"inputs[{i}]") for i, n in enumerate(input_names)]
        outputs = [self._tensor(n, f"outputs[{i}]") for i, n in enumerate(output_names)]
        for i, t in enumerate(inputs):
            if t.shape.rank is not None and t.shape.rank != 2:
                raise ModelLoadError(
                    f"input {t.name} has rank {t.shape.rank}, expected 2 (batch, length)",
                    field=f"inputs[{i}]",
                )
        for i, t in enumerate(outputs):
            if t.shape.rank is not None and t.shape.rank != 4:
                raise ModelLoadError(
                    f"output {t.name} has rank {t.shape.rank}, expected 4 (batch, heads, length, length)",
                    field=f"outputs[{i}]",
                )
        return inputs, outputs

    def _reload_frozen(
        self,
        intra_op_threads: int | None,
        inter_op_threads: int | None,
        precision: str,
        graph_rewrites: bool = True,
    ) -> None:
        """Replace graph and session by a frozen, rewritten copy (``_freeze``, ``_rewrite``); tensor
        names are unchanged. ``graph_rewrites=False`` freezes without rewriting: the graph as
        bert4keras wrote it, kept only to measure what the rewrites gain (``python -m bench profile``).

        Constant weights let oneDNN keep each Dense's weights in its own blocked layout between
        calls (``_FusedMatMul`` with a constant filter), and let bf16 casts fold once; they cost
        memory (``FROZEN_PRECISIONS`` says which precisions pay it). A graph that cannot be frozen
        (a TF2 export, whose layers live in library functions reading resource variables) keeps its
        variables and is not rewritten: correct, only slower.
        """
        input_names = [t.name for t in self._inputs]
        output_names = [t.name for t in self._outputs]
        graph = tf.Graph()
        try:
            graph_def = _freeze(self._session, self._graph, output_names)
            dims = {
                op.name: op.outputs[0].shape.as_list()
                if op.outputs[0].shape.rank is not None
                else None
                for op in self._graph.get_operations()
                if op.outputs
            }
            if graph_rewrites:
                self.rewrites = _rewrite(graph_def, output_names, dims)
            with graph.as_default():
                tf.import_graph_def(graph_def, name="")
        except (ValueError, TypeError, tf.errors.OpError) as exc:
            logger.warning(
                "%s cannot be frozen (%s); its weights stay variables (slower, and in bf16 cast "
                "every run)",
                self.model_dir,
                str(exc).splitlines()[0],
            )
            return
        self._session.close()
        self._graph = graph
        self._session = tf.compat.v1.Session(
            graph=self._graph, config=_session_config(intra_op_threads, inter_op_threads, precision)
        )
        self._inputs = [self._tensor(n, f"inputs[{i}]") for i, n in enumerate(input_names)]
        self._outputs = [self._tensor(n, f"outputs[{i}]") for i, n in enumerate(output_names)]
        self.frozen = True

    # -- request path --------------------------------------------------------------------------
    def _run(
        self, token_ids: npt.NDArray[Any], segment_ids: npt.NDArray[Any]
    ) -> list[npt.NDArray[Any]]:
        feed = {
            self._inputs[0]: token_ids.astype(self.input_dtypes[0], copy=False),
            self._inputs[1]: segment_ids.astype(self.input_dtypes[1], copy=False),
        }
        result: list[npt.NDArray[Any]] = self._session.run(self._outputs, feed_dict=feed)
        return result

    def op_time_by_type(
        self, token_ids: npt.NDArray[Any], segment_ids: npt.NDArray[Any]
    ) -> dict[str, float]:
        """Milliseconds per op type in one traced call at a warmed shape (TensorFlow's step stats).

        Where a call's time goes, for profiling (``python -m bench profile``), never on the request
        path: tracing slows the call it measures. Op types are those the runtime ran after grappler's
        rewrites (``_FusedMatMul``, ``_MklLayerNorm``...), which may differ from the graph's own.
        """
        self.check_shape(token_ids, segment_ids)
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        metadata = tf.compat.v1.RunMetadata()
        feed = {
            self._inputs[0]: token_ids.astype(self.input_dtypes[0], copy=False),
            self._inputs[1]: segment_ids.astype(self.input_dtypes[1], copy=False),
        }
        self._session.run(self._outputs, feed_dict=feed, options=options, run_metadata=metadata)
        spent: dict[str, float] = {}
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                # timeline_label reads "name = OpType(inputs)"; _SOURCE and friends have none.
                label = node.timeline_label.partition(" = ")[2]
                op_type = label.partition("(")[0] or node.node_name.partition(":")[0]
                micros = node.all_end_rel_micros or (
                    node.op_end_rel_micros - node.op_start_rel_micros
                )
                spent[op_type] = spent.get(op_type, 0.0) + micros / 1000.0
        return spent

    @property
    def graph_op_count(self) -> int:
        """Current number of ops in the graph (constant after load: the leak guard checks it)."""
        return len(self._graph.get_operations())

    def close(self) -> None:
        self._session.close()
