"""The opt-in ``openvino`` engine: OpenVINO's CPU plugin over a model converted by
``spo export-openvino``.

Same contract as ``nlp.runtime.SessionRuntime`` and ``nlp.onnx_runtime.OnnxRuntime``, so the pipeline
cannot tell them apart: one compiled model made at load, every bucket shape run once with full-size
inputs before the first request, ``run`` accepts only those shapes and is one ``InferRequest.infer``.

Why it exists: OpenVINO was ahead of every spo mode at every bucket shape in the issue 24 peer run
(int8 about 2x faster than the TF session's int8 up to 64 tokens). The TF session stays the default.

Shapes, chosen by measurement: one compiled model with dynamic ``[-1, -1]`` inputs, every bucket
shape run once at warm-up (the CPU plugin compiles and caches each shape's kernels then), rather
than one compiled model per bucket shape. 2 threads, AMD EPYC (2 cores shared with other jobs, so
the times are rough), RSS in MiB after warm-up and after N calls cycling the shapes up to 1,024
tokens, ms per call:

==============  ======  ==============  ======  =======  =======
model, shapes     RSS    after N calls    1x16    1x128    8x128
==============  ======  ==============  ======  =======  =======
demo dynamic       614    674 (1,500)      2.7      9.5     50.8
demo static      2,772  2,802 (1,500)      0.8      5.5     36.1
RBT6 dynamic     3,439  3,607 (800)          -        -        -
==============  ======  ==============  ======  =======  =======

Static shapes are faster (a fixed kernel per shape) but every compiled model holds its own copy of
the weights and buffers: 4.5x the memory on the 16 MB demo, and 77 copies of RBT6's 239 MB of
weights would not fit a worker (its times were taken at a load of 6 on 2 cores: not figures).
Dynamic RSS grows over the first pass of calls after warm-up (demo fp32: 610 -> 668 MiB in 1,000
calls, int8 731 -> 778) and is flat after it (668 -> 676 over 4,000 more calls; int8 778 -> 780
over 2,000); a second warm-up pass does not take that first step.

Threads come from ``intra_op_threads`` (``INFERENCE_NUM_THREADS``), one stream, the latency hint,
no CPU pinning or reservation (gunicorn runs one runtime per worker on shared cores). OpenVINO has
no knob for the spinning of its idle TBB workers.

Precision: an fp32 directory runs in fp32 (``INFERENCE_PRECISION_HINT`` f32) or, when asked, bf16
on a CPU with native bf16; an int8 directory (NNCF, ``spo export-openvino --precision int8``) runs
only as int8. Anything else is ``UnsupportedPrecision``.

This module does not import TensorFlow. ``openvino`` is an optional extra; without it, choosing this
engine is a ``ModelLoadError`` that names the install command.
"""

from __future__ import annotations

import logging
import threading
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
    "pip install 'spo-service[openvino]' (in a checkout: pip install -r requirements-openvino.lock)"
)
_NUMPY_TYPES = {"f32": np.float32, "i32": np.int32, "i64": np.int64}
# The op NNCF's post-training quantization leaves in an int8 model.
QUANTIZED_OP = "FakeQuantize"


def import_openvino() -> Any:
    """The ``openvino`` module, or ``ModelLoadError`` saying how to install it."""
    try:
        import openvino
    except ImportError as exc:
        raise ModelLoadError(
            f"this model directory is for the openvino engine, which needs openvino (not "
            f"installed): {INSTALL_HINT}",
            field="engine",
        ) from exc
    return openvino


def _heads(port: Any) -> int | None:
    """Axis 1 (heads) of an output port of shape ``(batch, heads, length, length)``; None if it is
    not static (or its shape cannot be read)."""
    try:
        shape = port.get_partial_shape()
        if shape.rank.is_dynamic or shape.rank.get_length() != 4 or shape[1].is_dynamic:
            return None
        return int(shape[1].get_length())
    except (AttributeError, RuntimeError, TypeError):  # an OpenVINO without these accessors
        return None


class OpenVinoRuntime(WarmedShapes):
    """A loaded, warmed OpenVINO compiled model. ``run`` accepts only the shapes it was warmed on."""

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
        ov = import_openvino()
        self.model_file = Path(model_file)
        self.shapes: frozenset[tuple[int, int]] = frozenset(shapes)
        self.shapes_fed: set[tuple[int, int]] = set()
        self.runs = 0
        started = time.perf_counter()
        self._core = ov.Core()
        try:
            model = self._core.read_model(str(self.model_file))
        except Exception as exc:  # openvino raises RuntimeError subclasses of its own
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelLoadError(
                f"cannot load the OpenVINO model {self.model_file}: {first}"
            ) from exc
        self.quantized = any(op.get_type_name() == QUANTIZED_OP for op in model.get_ops())
        self.precision = precision
        hint = self._inference_precision(ov, precision)
        self._input_ports, self.input_dtypes, self._output_ports = self._resolve(
            model, input_names, output_names, n_outputs
        )
        engine.check_output_heads(
            [
                (model.outputs[i].get_any_name(), _heads(model.outputs[i]))
                for i in self._output_ports
            ],
            output_heads,
            str(self.model_file),
        )
        config = {
            "INFERENCE_NUM_THREADS": intra_op_threads or 0,  # 0: OpenVINO's own choice
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": hint,
            "ENABLE_CPU_PINNING": False,
            "ENABLE_CPU_RESERVATION": False,
        }
        try:
            self._compiled = self._core.compile_model(model, "CPU", config)
        except Exception as exc:
            raise ModelLoadError(
                f"cannot compile the OpenVINO model {self.model_file}: {exc}"
            ) from exc
        self._output_index = [self._compiled.outputs[i] for i in self._output_ports]
        self._request = self._compiled.create_infer_request()
        self._lock = threading.Lock()  # an InferRequest is not safe to share between threads
        self.load_seconds = time.perf_counter() - started
        started = time.perf_counter()
        self._warm(vocab_size, seed, str(self.model_file))
        engine.release_free_heap()
        self.warm_seconds = time.perf_counter() - started
        self.op_count = 0  # no graph to grow: the compiled model is fixed at load
        logger.info(
            "openvino model loaded from %s (%s): %d shapes warmed, load %.1fs, warm-up %.1fs",
            self.model_file,
            "int8" if self.quantized else hint,
            len(self.shapes),
            self.load_seconds,
            self.warm_seconds,
        )

    @classmethod
    def model_path(cls, manifest: Manifest) -> Path:
        """The ``.xml`` of an openvino model directory (``manifest.engine_spec``); its ``.bin``
        lies beside it."""
        if manifest.engine_spec is None or manifest.engine_spec.name != "openvino":
            raise ModelLoadError(f"{manifest.directory} is not an openvino model directory")
        return manifest.engine_spec.file

    def _inference_precision(self, ov: Any, precision: str) -> str:
        """OpenVINO's ``INFERENCE_PRECISION_HINT`` for ``precision``, or ``UnsupportedPrecision``."""
        if self.quantized:
            if precision != "int8":
                raise UnsupportedPrecision(
                    f"{self.model_file} is an int8 OpenVINO model (spo export-openvino "
                    f"--precision int8); it runs only with precision int8, not {precision}",
                    field="precision",
                )
            return "f32"  # the ops NNCF left unquantized run in fp32
        if precision == "fp32":
            return "f32"
        if precision == "bf16":
            if not engine.cpu_supports_bf16():
                raise UnsupportedPrecision(
                    "precision bf16 needs a CPU with native bf16 (avx512_bf16 or amx_bf16 in "
                    "/proc/cpuinfo); this one has none: use fp32",
                    field="precision",
                )
            return "bf16"
        raise UnsupportedPrecision(
            f"precision {precision!r} needs an int8 OpenVINO model directory; {self.model_file} is "
            "fp32: make one with `spo export-openvino MODEL_DIR OUT --precision int8`, or use "
            "fp32 or bf16",
            field="precision",
        )

    def _resolve(
        self,
        model: Any,
        input_names: tuple[str, str] | None,
        output_names: Sequence[str] | None,
        n_outputs: int,
    ) -> tuple[tuple[int, int], tuple[Any, Any], list[int]]:
        """The input and output port indices in role order and the inputs' numpy dtypes
        (``nlp.engine.resolve_tensors``), by the names in ``model.json`` or else the model's own."""
        ports = {"inputs": list(model.inputs), "outputs": list(model.outputs)}
        names: dict[str, dict[str, int]] = {
            kind: {name: i for i, port in enumerate(found) for name in port.get_names()}
            for kind, found in ports.items()
        }

        def lookup(name: str, field: str) -> tuple[int, Any]:
            kind = field.partition("[")[0]
            index = names[kind].get(name)
            if index is None:
                raise ModelLoadError(
                    f"{field}: {name!r} is not an {kind[:-1]} of {self.model_file} "
                    f"(it has {sorted(names[kind])})",
                    field=field,
                )
            return index, ports[kind][index]

        def rank(found: tuple[int, Any]) -> int | None:
            shape = found[1].get_partial_shape()
            return None if shape.rank.is_dynamic else int(shape.rank.get_length())

        def own(kind: str) -> dict[str, str]:
            return {port.get_any_name(): port.get_any_name() for port in ports[kind]}

        inputs, outputs = engine.resolve_tensors(
            input_names,
            output_names,
            n_outputs,
            signature=(own("inputs"), own("outputs")),
            where=str(self.model_file),
            lookup=lookup,
            rank=rank,
        )
        dtypes = []
        for i, (_, port) in enumerate(inputs):
            kind = port.get_element_type().get_type_name()
            if kind not in _NUMPY_TYPES:
                raise ModelLoadError(
                    f"input {port.get_any_name()} is {kind}; expected a (batch, length) float or "
                    "integer tensor",
                    field=f"inputs[{i}]",
                )
            dtypes.append(_NUMPY_TYPES[kind])
        return (
            (inputs[0][0], inputs[1][0]),
            (dtypes[0], dtypes[1]),
            [index for index, _ in outputs],
        )

    def _run(
        self, token_ids: npt.NDArray[Any], segment_ids: npt.NDArray[Any]
    ) -> list[npt.NDArray[Any]]:
        feed = {
            self._input_ports[0]: np.ascontiguousarray(token_ids, dtype=self.input_dtypes[0]),
            self._input_ports[1]: np.ascontiguousarray(segment_ids, dtype=self.input_dtypes[1]),
        }
        with self._lock:
            # share_outputs=False (the default): the arrays returned are copies, not the request's
            # buffers that the next call overwrites.
            result = self._request.infer(feed)
            return [np.asarray(result[port]) for port in self._output_index]

    @property
    def graph_op_count(self) -> int:
        return self.op_count

    def close(self) -> None:
        self._request = None
        self._compiled = None
