"""The one stateful stage: a TF ``compat.v1`` Session over its own graph, fed numpy, returning numpy.

Why not ``tf.saved_model.load`` and eager calls: every new input shape traces a new graph and grows a
kernel cache that is never freed, so process memory climbs with every unseen length. Here the SavedModel
is loaded once into a private ``tf.Graph`` (for ``bf16`` and ``int8``, frozen and rewritten by
``nlp.tf_graph``: see ``FROZEN_PRECISIONS``); each shape from the fixed bucket list is run once at
start-up with full-size inputs (so every allocation size the request path needs has been made); then
the graph is finalized, so any code that would add a node raises instead of leaking. Nothing on the
request path creates a tensor or runs eagerly: ``run`` is one ``Session.run`` over numpy feeds.

This module holds the session only: the graph rewrites are ``nlp.tf_graph``'s, what it shares with the
ONNX engine (tensor resolution, warm-up, heap release, CPU facts) ``nlp.engine``'s, and the per-op
profile of a call ``bench.op_profile``'s. With ``nlp.tf_graph``, the only place in ``nlp`` that imports
TensorFlow (``nlp.tokenization`` does too, through bert4keras).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy.typing as npt

from nlp import quiet_tensorflow

with quiet_tensorflow():
    import tensorflow as tf

from nlp import engine
from nlp.config import (
    DEFAULT_PRECISION,
    PRECISIONS,
    SHORT_CALL_PLANS,
    LoadOptions,
    ThreadPlan,
    plan_sessions,
)
from nlp.engine import WarmedShapes
from nlp.errors import ModelLoadError, UnsupportedPrecision
from nlp.manifest import Manifest
from nlp.tasks import OutputHeads
from nlp.tf_graph import (
    check_extra_rewrites,
    frozen_graph_def,
    lookup_table,
    max_length_problem,
    quiet_tf_logger,
)

logger = logging.getLogger(__name__)

SIGNATURE = "serving_default"


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


# A thread plan (``nlp.config.ThreadPlan``) and the measured ones (``SHORT_CALL_PLANS``, why there) live
# in ``nlp.config``, without TensorFlow, so that the service's sizing can count the sessions they make.


def plan_threads(plan: ThreadPlan, length: int, upper: int) -> int:
    """The intra-op threads ``plan`` gives a call of ``length`` tokens, at most ``upper``.

    >>> [plan_threads(((32, 1),), n, 2) for n in (16, 32, 33)]
    [1, 1, 2]
    """
    for up_to, threads in sorted(plan):
        if length <= up_to:
            return max(1, min(threads, upper))
    return upper


# Precisions served from a frozen, rewritten graph (``nlp.tf_graph.frozen_graph_def``). bf16 must be: with
# variables, grappler casts every weight to bf16 on every run. int8 frozen runs short calls 1.5-1.8x
# faster than fp32, from its variables only 1.07x (RBT6, BENCHMARKS.md). fp32 is served from its variables: frozen, the RBT6 benchmark
# model measured 1.1 GiB more RSS per worker (2,886 vs 1,792 MiB with the 74 default shapes), a 13 s
# longer cold start, and 9% fewer texts/s over the single-text workload (faster at 16-32 tokens,
# slower from 128); BENCHMARKS.md, "Freezing fp32".
FROZEN_PRECISIONS = ("bf16", "int8")


def tensor_heads(output: Any) -> int | None:
    """Axis 1 (heads) of a ``(batch, heads, length, length)`` output tensor; None if not static."""
    dims = output.shape.as_list() if output.shape.rank == 4 else None
    heads: int | None = dims[1] if dims else None
    return heads


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
        output_heads: Sequence[OutputHeads] = (),
        vocab_size: int,
        vocab_file: str | Path | None = None,
        intra_op_threads: int | None = None,
        inter_op_threads: int | None = None,
        precision: str = DEFAULT_PRECISION,
        seed: int = 0,
        freeze: bool | None = None,
        graph_rewrites: bool = True,
        extra_rewrites: Sequence[str] = (),
        thread_plan: ThreadPlan = (),
    ) -> None:
        """``output_heads``: what ``model.json`` says each output has (``Task.output_heads``; empty:
        not checked); ``vocab_size``: token ids run from 0 to it, checked against the table the
        token ids index before warm-up (``vocab_file`` is named in that error).

        ``freeze``: serve a frozen, rewritten graph (default: for ``FROZEN_PRECISIONS``);
        ``graph_rewrites=False`` freezes without rewriting; ``extra_rewrites``: the exact rewrites
        not applied by default (``nlp.tf_graph.OPT_IN_REWRITES``). All three are for tests and
        ``bench``.

        ``thread_plan`` (opt-in; ``ThreadPlan``): short calls on sessions with fewer intra-op threads
        (``intra_op_threads`` is the upper bound, and must be set). Frozen graphs only: each extra
        session is a session of the same graph, which holds its own copy of the constants (see
        ``_plan_sessions``); a graph served from its variables ignores the plan (with a warning)."""
        if precision not in PRECISIONS:
            raise UnsupportedPrecision(
                f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
            )
        if precision == "bf16" and not engine.cpu_supports_bf16():
            raise UnsupportedPrecision(
                "precision bf16 needs a CPU with AVX-512 BF16 or AMX (avx512_bf16 / amx_bf16 in "
                "/proc/cpuinfo); this one has neither: use fp32"
            )
        if precision == "int8" and (reason := engine.int8_support()) is not None:
            raise UnsupportedPrecision(
                f"precision int8 cannot run here: {reason}; serve the fp32 model instead"
            )
        check_extra_rewrites(extra_rewrites)
        self.model_dir = Path(model_dir)
        self.precision = precision
        self.shapes: frozenset[tuple[int, int]] = frozenset(shapes)
        self.shapes_fed: set[tuple[int, int]] = set()
        self.runs = 0
        self.frozen = False
        self.rewrites: dict[str, int] = {}
        self.thread_plan: ThreadPlan = ()
        self._threads = intra_op_threads
        self._by_threads: dict[int, Any] = {}
        self._graph = tf.Graph()
        with quiet_tensorflow():  # the first session probes for CUDA devices
            self._session = tf.compat.v1.Session(
                graph=self._graph,
                config=_session_config(intra_op_threads, inter_op_threads, precision),
            )
        started = time.perf_counter()
        try:
            with self._graph.as_default(), quiet_tf_logger():
                # The v1 loader is deprecated in favour of tf.saved_model.load, whose eager
                # per-shape tracing is exactly what this runtime exists to avoid.
                meta = tf.compat.v1.saved_model.loader.load(
                    self._session, ["serve"], str(self.model_dir)
                )
            self._inputs, self._outputs = self._resolve(meta, input_names, output_names, n_outputs)
            engine.check_output_heads(
                [(t.name, tensor_heads(t)) for t in self._outputs],
                output_heads,
                str(self.model_dir),
            )
            self._check_vocab_size(vocab_size, vocab_file)
            self._check_max_length()
            if precision in FROZEN_PRECISIONS if freeze is None else freeze:
                self._reload_frozen(
                    intra_op_threads, inter_op_threads, precision, graph_rewrites, extra_rewrites
                )
            if thread_plan:
                self._plan_sessions(thread_plan, inter_op_threads, precision)
        except ModelLoadError:
            self.close()
            raise
        except Exception as exc:  # TensorFlow raises many types for a bad SavedModel
            self.close()
            raise ModelLoadError(
                f"cannot load the SavedModel in {self.model_dir}: {engine.first_line(exc)}"
            ) from exc
        self.input_dtypes = tuple(t.dtype.as_numpy_dtype for t in self._inputs)
        self.load_seconds = time.perf_counter() - started
        started = time.perf_counter()
        try:
            self._warm(vocab_size, seed, str(self.model_dir))
        except ModelLoadError:
            self.close()
            raise
        self._graph.finalize()
        engine.release_free_heap()
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
        """``WarmedShapes.for_model`` plus the TF session's own options of ``options``: the thread
        plan measured for the precision (``short_call_threads``) and the ``extra_rewrites``. Each asked
        for where it cannot apply logs one line and the model loads without it."""
        arguments = engine.load_arguments(manifest, options, shapes, vocab_size)
        precision = arguments["precision"]
        frozen = precision in FROZEN_PRECISIONS
        plan = options.thread_plan(precision)
        if options.short_call_threads and not plan:
            logger.warning(
                "%s: no measured short-call thread plan for %s (SHORT_CALL_PLANS: %s); every call "
                "runs on %s intra-op threads",
                manifest.directory,
                precision,
                ", ".join(SHORT_CALL_PLANS) or "none",
                options.intra_op_threads,
            )
        elif plan and not plan_sessions(plan, options.intra_op_threads):
            logger.info(
                "%s: short-call thread plan %s makes no second session at %s intra-op thread(s)",
                manifest.directory,
                plan,
                options.intra_op_threads,
            )
        if options.extra_rewrites and not frozen:
            logger.warning(
                "%s: extra rewrites %s apply to frozen graphs (%s); %s is served from its variables, "
                "without them",
                manifest.directory,
                ", ".join(options.extra_rewrites),
                ", ".join(FROZEN_PRECISIONS),
                precision,
            )
        runtime = cls(
            cls.model_path(manifest),
            **arguments,
            vocab_file=manifest.vocab_path,
            thread_plan=plan,
            extra_rewrites=options.extra_rewrites if frozen else (),
        )
        if runtime._by_threads:
            logger.info(
                "%s: short-call thread plan %s: sessions on %s intra-op thread(s) beside the main "
                "one's %s",
                manifest.directory,
                runtime.thread_plan,
                ", ".join(map(str, sorted(runtime._by_threads))),
                options.intra_op_threads,
            )
        return runtime

    @classmethod
    def model_path(cls, manifest: Manifest) -> Path:
        """The SavedModel directory: the model directory itself."""
        return manifest.directory

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
        """The graph's input and output tensors (``nlp.engine.resolve_tensors``), by the names in
        ``model.json`` or from the ``serving_default`` signature."""
        signature = meta.signature_def.get(SIGNATURE)
        return engine.resolve_tensors(
            input_names,
            output_names,
            n_outputs,
            signature=None
            if signature is None
            else (
                {k: v.name for k, v in signature.inputs.items()},
                {k: v.name for k, v in signature.outputs.items()},
            ),
            where=f"{self.model_dir} ('{SIGNATURE}' signature)",
            lookup=self._tensor,
            rank=lambda t: t.shape.rank,
        )

    def _check_vocab_size(self, vocab_size: int, vocab_file: str | Path | None) -> None:
        """Every token id has a row in the table the token ids index, where the graph shows it
        (``nlp.tf_graph.lookup_table``); a vocab smaller than the table is fine (``spo export``
        allows it)."""
        table = lookup_table(self._inputs[0])
        if table is None or vocab_size <= table[1]:
            return
        name, rows = table
        raise ModelLoadError(
            f"{vocab_file or 'the vocab'} has {vocab_size} tokens, but the token ids of "
            f"{self.model_dir} ({self._inputs[0].name}) index a table of {rows} rows ({name}): "
            "use the vocab the model was trained with (a blank line is a token too), and check "
            "that model.json's inputs.token_ids names the token ids",
            field="vocab.path",
        )

    def _check_max_length(self) -> None:
        """The longest shape fits the position embeddings, where the graph has them
        (``nlp.tf_graph.max_length_problem``)."""
        longest = max((length for _, length in self.shapes), default=0)
        problem = max_length_problem(self._graph, longest, self.model_dir)
        if problem is not None:
            raise ModelLoadError(problem, field="max_length")

    def _reload_frozen(
        self,
        intra_op_threads: int | None,
        inter_op_threads: int | None,
        precision: str,
        graph_rewrites: bool = True,
        extra_rewrites: Sequence[str] = (),
    ) -> None:
        """Replace graph and session by a frozen, rewritten copy (``nlp.tf_graph``); tensor
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
            graph_def, self.rewrites = frozen_graph_def(
                self._session,
                self._graph,
                output_names,
                graph_rewrites=graph_rewrites,
                extra_rewrites=extra_rewrites,
            )
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

    def _plan_sessions(
        self, plan: ThreadPlan, inter_op_threads: int | None, precision: str
    ) -> None:
        """One more session of the (frozen) graph per thread count of ``plan`` below the upper bound.

        TensorFlow gives each session its own intra-op pool only with ``TF_OVERRIDE_GLOBAL_THREADPOOL``
        (``nlp`` sets it); otherwise every session of a process shares the first one's pool, and a
        session asked for one thread would still run on two. oneDNN's kernels take their thread
        count from that pool and from nothing a ``Session.run`` can pass (``RunOptions`` selects an
        inter-op pool only), so a second session is the one way to run a call on fewer threads.
        Sessions do not share constants: each holds the frozen weights once more and its kernels
        their own weight caches (``python -m bench threadplan`` measures it: about 1.1 GiB for the
        RBT6 fp32 graph), which is why the plan is opt-in and refused for a graph with variables
        (a second session would restore every variable again).
        """
        if not self.frozen:
            logger.warning(
                "%s: the thread plan is for frozen graphs (its sessions would each restore the "
                "variables); serving every call on %s intra-op threads",
                self.model_dir,
                self._threads,
            )
            return
        if self._threads is None:
            raise ModelLoadError(
                "a thread plan needs intra_op_threads (its upper bound)", field="intra_op_threads"
            )
        plan = tuple(sorted((int(n), int(t)) for n, t in plan))
        if any(n < 1 or t < 1 for n, t in plan):
            raise ModelLoadError(f"thread plan entries must be positive, got {plan}", field="plan")
        self.thread_plan = plan
        for _, threads in plan:
            threads = min(threads, self._threads)
            if threads < self._threads and threads not in self._by_threads:
                self._by_threads[threads] = tf.compat.v1.Session(
                    graph=self._graph, config=_session_config(threads, inter_op_threads, precision)
                )

    def session_threads(self, length: int) -> int:
        """The intra-op threads a call of ``length`` tokens runs on (the thread plan's choice)."""
        if self._threads is None:
            return 0  # TensorFlow's default; no plan without a bound
        threads = plan_threads(self.thread_plan, length, self._threads)
        return threads if threads in self._by_threads else self._threads

    # -- request path --------------------------------------------------------------------------
    def _run(
        self, token_ids: npt.NDArray[Any], segment_ids: npt.NDArray[Any], **traced: Any
    ) -> list[npt.NDArray[Any]]:
        """One unchecked ``Session.run`` (on the session the thread plan picks for its length);
        ``traced``: its ``options`` and ``run_metadata``, for the profile of ``bench.op_profile``
        only."""
        feed = {
            self._inputs[0]: token_ids.astype(self.input_dtypes[0], copy=False),
            self._inputs[1]: segment_ids.astype(self.input_dtypes[1], copy=False),
        }
        session = self._session
        if self._by_threads:
            session = self._by_threads.get(self.session_threads(token_ids.shape[1]), session)
        result: list[npt.NDArray[Any]] = session.run(self._outputs, feed_dict=feed, **traced)
        return result

    @property
    def graph_op_count(self) -> int:
        """Current number of ops in the graph (constant after load: the leak guard checks it)."""
        return len(self._graph.get_operations())

    def close(self) -> None:
        for session in self._by_threads.values():
            session.close()
        self._session.close()
