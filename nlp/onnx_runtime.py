"""The opt-in ``onnx`` engine: ONNX Runtime over a model converted by ``spo export-onnx``.

Same contract as ``nlp.runtime.SessionRuntime``, so the pipeline cannot tell them apart: one session
created at load, every bucket shape run once with full-size inputs before the first request (ONNX
Runtime's arena and per-shape memory plans are made then, so the request path allocates nothing new),
``run`` accepts only those shapes and is one ``InferenceSession.run`` over numpy feeds.

Why it exists: on short texts a TF session call is bound by per-call overhead, and ONNX Runtime with
int8 weights is several times faster there (BENCHMARKS.md). The TF session stays the default.

This module does not import TensorFlow. ``onnxruntime`` is an optional extra; without it, choosing
this engine is a ``ModelLoadError`` that names the install command.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from nlp import engine
from nlp.engine import WarmedShapes
from nlp.errors import ModelLoadError, UnsupportedPrecision
from nlp.manifest import Manifest
from nlp.tasks import OutputHeads

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "pip install 'spo-service[onnx]' (in a checkout: pip install -r requirements-onnx.lock)"
)
_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(int32)": np.int32, "tensor(int64)": np.int64}


def import_onnxruntime() -> Any:
    """The ``onnxruntime`` module, or ``ModelLoadError`` saying how to install it."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise ModelLoadError(
            f"this model directory is for the onnx engine, which needs onnxruntime (not "
            f"installed): {INSTALL_HINT}",
            field="engine",
        ) from exc
    return onnxruntime


def _heads(shape: Any) -> int | None:
    """Axis 1 (heads) of an output's declared shape (ints, or names for dynamic axes); None if
    not a fixed number."""
    if not isinstance(shape, (list, tuple)) or len(shape) != 4:
        return None
    heads = shape[1]
    return heads if isinstance(heads, int) and heads > 0 else None


class OnnxRuntime(WarmedShapes):
    """A loaded, warmed ONNX Runtime session. ``run`` accepts only the shapes it was warmed on."""

    def __init__(
        self,
        model_file: str | Path,
        *,
        shapes: Iterable[tuple[int, int]],
        input_names: tuple[str, str] | None,
        output_names: Sequence[str] | None,
        n_outputs: int,
        output_heads: Sequence[OutputHeads] = (),
        vocab_size: int,
        intra_op_threads: int | None = None,
        inter_op_threads: int | None = None,
        precision: str = "fp32",
        seed: int = 0,
    ) -> None:
        """``output_heads``: what ``model.json`` says each output has (``Task.output_heads``;
        empty: not checked)."""
        if precision != "fp32":
            raise UnsupportedPrecision(
                f"precision {precision!r} is a mode of the tf engine; an onnx model directory runs "
                "as converted (fp32, or int8 from `spo export-onnx --precision int8`): use fp32",
                field="precision",
            )
        ort = import_onnxruntime()
        self.model_file = Path(model_file)
        self.precision = precision
        self.shapes: frozenset[tuple[int, int]] = frozenset(shapes)
        self.shapes_fed: set[tuple[int, int]] = set()
        self.runs = 0
        started = time.perf_counter()
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads or 0
        options.inter_op_num_threads = inter_op_threads or 0
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        # Idle pool threads block instead of spinning: gunicorn runs one session per worker on
        # shared cores, where spinning threads take the CPU from the other workers' model calls.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self._session = ort.InferenceSession(
                str(self.model_file), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own exception types for a bad file
            raise ModelLoadError(f"cannot load the ONNX model {self.model_file}: {exc}") from exc
        self._input_names, self.input_dtypes, self._output_names = self._resolve(
            input_names, output_names, n_outputs
        )
        declared = {o.name: o.shape for o in self._session.get_outputs()}
        engine.check_output_heads(
            [(name, _heads(declared[name])) for name in self._output_names],
            output_heads,
            str(self.model_file),
        )
        self.load_seconds = time.perf_counter() - started
        started = time.perf_counter()
        self._warm(vocab_size, seed, str(self.model_file))
        engine.release_free_heap()
        self.warm_seconds = time.perf_counter() - started
        self.op_count = 0  # no graph to grow: the session's plan is fixed at load
        logger.info(
            "onnx model loaded from %s: %d shapes warmed, load %.1fs, warm-up %.1fs",
            self.model_file,
            len(self.shapes),
            self.load_seconds,
            self.warm_seconds,
        )

    @classmethod
    def model_path(cls, manifest: Manifest) -> Path:
        """The onnx file of an onnx model directory (``manifest.engine_spec``)."""
        if manifest.engine_spec is None:
            raise ModelLoadError(f"{manifest.directory} is not an onnx model directory")
        return manifest.engine_spec.file

    def _resolve(
        self,
        input_names: tuple[str, str] | None,
        output_names: Sequence[str] | None,
        n_outputs: int,
    ) -> tuple[tuple[str, str], tuple[Any, Any], list[str]]:
        """Input names, their numpy dtypes and output names (``nlp.engine.resolve_tensors``), by the
        names in ``model.json`` or else the model's own."""
        declared = {
            "inputs": {i.name: i for i in self._session.get_inputs()},
            "outputs": {o.name: o for o in self._session.get_outputs()},
        }

        def lookup(name: str, field: str) -> Any:
            kind = field.partition("[")[0]
            node = declared[kind].get(name)
            if node is None:
                raise ModelLoadError(
                    f"{field}: {name!r} is not an {kind[:-1]} of {self.model_file} "
                    f"(it has {sorted(declared[kind])})",
                    field=field,
                )
            return node

        inputs, outputs = engine.resolve_tensors(
            input_names,
            output_names,
            n_outputs,
            signature=({n: n for n in declared["inputs"]}, {n: n for n in declared["outputs"]}),
            where=str(self.model_file),
            lookup=lookup,
            rank=lambda node: len(node.shape),
        )
        for i, node in enumerate(inputs):
            if node.type not in _NUMPY_TYPES:
                raise ModelLoadError(
                    f"input {node.name} is {node.type}; expected a (batch, length) float or "
                    "integer tensor",
                    field=f"inputs[{i}]",
                )
        return (
            (inputs[0].name, inputs[1].name),
            (_NUMPY_TYPES[inputs[0].type], _NUMPY_TYPES[inputs[1].type]),
            [o.name for o in outputs],
        )

    def _run(
        self, token_ids: npt.NDArray[Any], segment_ids: npt.NDArray[Any]
    ) -> list[npt.NDArray[Any]]:
        feed = {
            self._input_names[0]: token_ids.astype(self.input_dtypes[0], copy=False),
            self._input_names[1]: segment_ids.astype(self.input_dtypes[1], copy=False),
        }
        result: list[npt.NDArray[Any]] = self._session.run(self._output_names, feed)
        return result

    @property
    def graph_op_count(self) -> int:
        return self.op_count

    def close(self) -> None:
        self._session = None
