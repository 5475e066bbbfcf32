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

import contextlib
import ctypes
import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from nlp.config import LoadOptions
from nlp.errors import ModelLoadError, UnsupportedPrecision
from nlp.manifest import Manifest
from nlp.protocols import WarmedShapes

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


def _release_free_heap() -> None:
    """Hand glibc's free heap pages back after loading and warm-up (as ``nlp.runtime`` does)."""
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).malloc_trim(0)


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
        vocab_size: int,
        intra_op_threads: int | None = None,
        inter_op_threads: int | None = None,
        precision: str = "fp32",
        seed: int = 0,
    ) -> None:
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
        self._input_names, self.input_dtypes = self._resolve_inputs(input_names)
        self._output_names = self._resolve_outputs(output_names, n_outputs)
        self.load_seconds = time.perf_counter() - started
        started = time.perf_counter()
        self._warm(vocab_size, seed)
        _release_free_heap()
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
    def for_model(
        cls,
        manifest: Manifest,
        options: LoadOptions,
        *,
        shapes: Iterable[tuple[int, int]],
        vocab_size: int,
    ) -> OnnxRuntime:
        """The runtime of an onnx model directory (``manifest.engine_spec``), with the threads and
        precision of ``options``, warmed on ``shapes``."""
        if manifest.engine_spec is None:
            raise ModelLoadError(f"{manifest.directory} is not an onnx model directory")
        return cls(
            manifest.engine_spec.file,
            shapes=shapes,
            input_names=manifest.input_names,
            output_names=manifest.output_names,
            n_outputs=manifest.n_outputs,
            vocab_size=vocab_size,
            intra_op_threads=options.intra_op_threads,
            inter_op_threads=options.inter_op_threads,
            precision=options.precision,
        )

    def _resolve_inputs(
        self, names: tuple[str, str] | None
    ) -> tuple[tuple[str, str], tuple[Any, Any]]:
        declared = {i.name: i for i in self._session.get_inputs()}
        if names is None:
            if len(declared) != 2:
                raise ModelLoadError(
                    f"{self.model_file} has inputs {sorted(declared)}; expected token and segment ids",
                    field="inputs",
                )
            keys = sorted(declared)
            token = next((k for k in keys if "token" in k.lower()), keys[0])
            names = (token, next(k for k in keys if k != token))
        dtypes = []
        for i, name in enumerate(names):
            node = declared.get(name)
            if node is None:
                raise ModelLoadError(
                    f"inputs[{i}]: {name!r} is not an input of {self.model_file} "
                    f"(it has {sorted(declared)})",
                    field=f"inputs[{i}]",
                )
            if len(node.shape) != 2 or node.type not in _NUMPY_TYPES:
                raise ModelLoadError(
                    f"input {name} is {node.type} of rank {len(node.shape)}; expected a rank-2 "
                    "(batch, length) float or integer tensor",
                    field=f"inputs[{i}]",
                )
            dtypes.append(_NUMPY_TYPES[node.type])
        return (names[0], names[1]), (dtypes[0], dtypes[1])

    def _resolve_outputs(self, names: Sequence[str] | None, n_outputs: int) -> list[str]:
        declared = {o.name: o for o in self._session.get_outputs()}
        resolved = list(names) if names is not None else sorted(declared)
        if len(resolved) != n_outputs:
            raise ModelLoadError(
                f"the model has {len(resolved)} outputs, the task needs {n_outputs}",
                field="outputs",
            )
        for i, name in enumerate(resolved):
            node = declared.get(name)
            if node is None:
                raise ModelLoadError(
                    f"outputs[{i}]: {name!r} is not an output of {self.model_file}",
                    field=f"outputs[{i}]",
                )
            if len(node.shape) != 4:
                raise ModelLoadError(
                    f"output {name} has rank {len(node.shape)}, expected 4 "
                    "(batch, heads, length, length)",
                    field=f"outputs[{i}]",
                )
        return resolved

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
