"""What the engines share, written once: ``nlp.runtime.SessionRuntime`` (TensorFlow),
``nlp.onnx_runtime.OnnxRuntime`` (ONNX Runtime) and ``nlp.openvino_runtime.OpenVinoRuntime`` (OpenVINO).

- ``WarmedShapes``: every bucket shape run once at load, ``run`` refusing any other shape, and
  ``for_model`` (a runtime from a manifest and the load options);
- ``load_arguments``: what a model directory and the load options say about how to load it;
- ``resolve_tensors``: which model tensors are the token ids, the segment ids and the task's outputs
  (named in ``model.json``, else taken from the model's own signature), checked for count and rank;
  ``check_output_heads``: each output has the heads ``model.json``'s labels give it;
- ``release_free_heap``: glibc's free pages handed back after loading;
- CPU facts: the flags of ``/proc/cpuinfo`` and what they allow (bf16, int8), and whether the
  process runs oneDNN kernels (asked of TensorFlow's build, lazily: only the TF engine asks).

No TensorFlow at import time.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import numpy as np
import numpy.typing as npt

from nlp.config import LoadOptions
from nlp.errors import InvalidInput, ModelLoadError
from nlp.manifest import Manifest
from nlp.tasks import OutputHeads

T = TypeVar("T")


class WarmedShapes:
    """The bucketed-shape half of ``nlp.protocols.Runtime``, shared by both engines: every shape is
    run once at load, and ``run`` refuses any other.

    A subclass sets ``shapes`` (and empty ``shapes_fed``, ``runs = 0``), implements ``_run`` (one
    unchecked model call), and calls ``_warm`` once loaded.
    """

    shapes: frozenset[tuple[int, int]]
    shapes_fed: set[tuple[int, int]]
    runs: int

    def __init__(self, model: str | Path, **arguments: Any) -> None:
        raise NotImplementedError  # each engine's own: the model file or directory, and ``arguments``

    @classmethod
    def model_path(cls, manifest: Manifest) -> Path:
        """What this engine loads of ``manifest``'s directory (the directory, or a file in it)."""
        raise NotImplementedError

    @classmethod
    def for_model(
        cls,
        manifest: Manifest,
        options: LoadOptions,
        *,
        shapes: Iterable[tuple[int, int]],
        vocab_size: int,
    ) -> Self:
        """The runtime of ``manifest``'s model, with the threads and precision of ``options``,
        warmed on ``shapes``."""
        return cls(
            cls.model_path(manifest), **load_arguments(manifest, options, shapes, vocab_size)
        )

    def _run(
        self, token_ids: npt.NDArray[Any], segment_ids: npt.NDArray[Any]
    ) -> list[npt.NDArray[Any]]:
        raise NotImplementedError

    def _warm(self, vocab_size: int, seed: int, where: str = "the model") -> None:
        """Run every shape once with full-size inputs (no padding), so the first real requests of
        each shape allocate nothing new. A run that fails is a ``ModelLoadError`` naming the model
        (``where``) and the shape: the model and its ``model.json`` do not fit (the vocab, the
        inputs, ``max_length``)."""
        rng = np.random.default_rng(seed)
        low = min(5, vocab_size - 1)
        for batch, length in sorted(self.shapes):
            ids = rng.integers(low, vocab_size, size=(batch, length), dtype=np.int64)
            try:
                self._run(ids, np.zeros_like(ids))
            except Exception as exc:  # each engine raises its own types
                raise ModelLoadError(
                    f"{where}: the warm-up run of shape ({batch}, {length}) failed: "
                    f"{first_line(exc)} (do model.json's vocab, inputs and max_length fit the "
                    "model?)"
                ) from exc
        self.runs = 0

    def check_shape(self, token_ids: npt.NDArray[Any], segment_ids: npt.NDArray[Any]) -> None:
        """``InvalidInput`` unless both arrays have one and the same warmed shape."""
        shape = tuple(token_ids.shape)
        if shape not in self.shapes or segment_ids.shape != token_ids.shape:
            raise InvalidInput(f"input shape {shape} is not one of the warmed bucket shapes")

    def run(
        self, token_ids: npt.NDArray[Any], segment_ids: npt.NDArray[Any]
    ) -> list[npt.NDArray[Any]]:
        """Model outputs (numpy, ``(batch, heads, length, length)`` each) for one bucketed batch."""
        self.check_shape(token_ids, segment_ids)
        self.shapes_fed.add((token_ids.shape[0], token_ids.shape[1]))
        self.runs += 1
        return self._run(token_ids, segment_ids)


def load_arguments(
    manifest: Manifest,
    options: LoadOptions,
    shapes: Iterable[tuple[int, int]],
    vocab_size: int,
) -> dict[str, Any]:
    """What the engines' constructors take besides the model file: the tensor names, task and output
    heads of ``manifest``, the threads and precision of ``options`` (none asked: the model's own),
    the ``shapes`` to warm."""
    return {
        "shapes": shapes,
        "input_names": manifest.input_names,
        "output_names": manifest.output_names,
        "n_outputs": manifest.n_outputs,
        "output_heads": manifest.task.output_heads(manifest),
        "vocab_size": vocab_size,
        "intra_op_threads": options.intra_op_threads,
        "inter_op_threads": options.inter_op_threads,
        "precision": options.resolve_precision(manifest.precision).precision,
    }


# -- model tensors -------------------------------------------------------------------------------
def signature_inputs(keys: Sequence[str], where: str) -> tuple[str, str]:
    """The token-ids and segment-ids keys among a signature's two inputs: the segment ids are the
    one key naming ``segment`` or ``type`` (bert4keras's ``Input-Segment``, the common
    ``token_type_ids``), else the token ids are the first naming ``token``, else the first by name.

    >>> signature_inputs(["Input-Token", "Input-Segment"], "m")
    ('Input-Token', 'Input-Segment')
    >>> signature_inputs(["token_type_ids", "input_ids"], "m")
    ('input_ids', 'token_type_ids')
    """
    keys = sorted(keys)
    if len(keys) != 2:
        raise ModelLoadError(
            f"{where} has {len(keys)} inputs {keys}; expected token and segment ids",
            field="inputs",
        )
    segments = [k for k in keys if "segment" in k.lower() or "type" in k.lower()]
    if len(segments) == 1:
        return next(k for k in keys if k != segments[0]), segments[0]
    token = next((k for k in keys if "token" in k.lower()), keys[0])
    return token, next(k for k in keys if k != token)


def resolve_tensors(
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    n_outputs: int,
    *,
    signature: tuple[Mapping[str, str], Mapping[str, str]] | None,
    where: str,
    lookup: Callable[[str, str], T],
    rank: Callable[[T], int | None],
) -> tuple[list[T], list[T]]:
    """The model's two input tensors and its ``n_outputs`` output tensors, in role order.

    ``input_names`` / ``output_names``: as ``model.json`` names them, or None to take them from
    ``signature`` (input key -> tensor name, output key -> tensor name; outputs in key order, as
    TensorFlow flattens a dict of outputs). ``lookup(name, field)`` finds one tensor or raises
    ``ModelLoadError`` naming ``field``; ``rank`` says its rank (None: unknown, not checked).
    ``where`` names the model in errors.
    """
    if input_names is None or output_names is None:
        if signature is None:
            which = "input" if input_names is None else "output"
            raise ModelLoadError(
                f"{where}: model.json names no {which} tensors and the model has no signature",
                field=f"{which}s",
            )
        if input_names is None:
            token, segment = signature_inputs(list(signature[0]), where)
            input_names = (signature[0][token], signature[0][segment])
        if output_names is None:
            output_names = [signature[1][k] for k in sorted(signature[1])]
    if len(output_names) != n_outputs:
        raise ModelLoadError(
            f"the model has {len(output_names)} outputs, the task needs {n_outputs}",
            field="outputs",
        )
    inputs = [lookup(n, f"inputs[{i}]") for i, n in enumerate(input_names)]
    outputs = [lookup(n, f"outputs[{i}]") for i, n in enumerate(output_names)]
    for kind, tensors, names, expected, axes in (
        ("input", inputs, input_names, 2, "(batch, length)"),
        ("output", outputs, output_names, 4, "(batch, heads, length, length)"),
    ):
        for i, (tensor, name) in enumerate(zip(tensors, names, strict=True)):
            got = rank(tensor)
            if got is not None and got != expected:
                raise ModelLoadError(
                    f"{kind} {name} has rank {got}, expected {expected} {axes}",
                    field=f"{kind}s[{i}]",
                )
    return inputs, outputs


def check_output_heads(
    found: Sequence[tuple[str, int | None]], expected: Sequence[OutputHeads], where: str
) -> None:
    """``ModelLoadError`` unless each output, ``(name, heads)`` in role order (``heads`` None where
    the model does not say), has the heads ``model.json`` gives its role (``Task.output_heads``);
    ``where`` names the model. Nothing is checked when ``expected`` is empty."""
    if not expected:
        return
    for i, ((name, heads), want) in enumerate(zip(found, expected, strict=True)):
        if heads is not None and heads != want.heads:
            raise ModelLoadError(
                f"{where}: output {name} has {heads} heads, but model.json makes it the "
                f"{want.role} output, which has {want.heads} ({want.why}): {want.fix}",
                field=f"outputs[{i}]",
            )


# The lines of a TensorFlow error that say where, not what: its heading, the failing node, the
# stack it was defined at, ``[[{{node ...}}]]``.
_WHERE = re.compile(
    r"^(Graph execution error:|Detected at node .*|Node: .*|File \".*|\[\[.*\]\]|"
    r"Original stack trace for .*|\(most recent call last\):?)$"
)


def first_line(exc: BaseException) -> str:
    """The first line that says something of an exception's message: TensorFlow's start with
    "Graph execution error:" and the failing node and the stack it was defined at, then say what.

    >>> first_line(RuntimeError("Graph execution error:\\n\\nDetected at node 'save/RestoreV2' "
    ...     "defined at (most recent call last):\\nNode: 'save/RestoreV2'\\nRead less bytes than "
    ...     "requested\\n\\t [[{{node save/RestoreV2}}]]"))
    'Read less bytes than requested'
    """
    text = str(getattr(exc, "message", None) or exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if not _WHERE.match(line)]
    return said[0] if said else lines[0] if lines else type(exc).__name__


# -- memory --------------------------------------------------------------------------------------
def release_free_heap() -> None:
    """Hand glibc's free heap pages back to the OS after loading (a no-op under other allocators).

    Loading, freezing and warming free several copies of the weights; without this, RSS stays at
    the load-time peak although the memory is unused (bf16 on RBT6: 3.5 GiB -> 1.7 GiB).
    """
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).malloc_trim(0)


# -- CPU facts -----------------------------------------------------------------------------------
# CPU flags of int8 dot-product instructions. Without them oneDNN multiplies u8 x s8 with
# ``vpmaddubsw``, whose 16-bit intermediate sums saturate: results drift, and it is no faster.
INT8_CPU_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
# CPU flags of native bf16 matmul (AVX-512 BF16, AMX-BF16).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpu_flags() -> set[str]:
    """The words of ``/proc/cpuinfo`` (its flags among them); empty where it cannot be read."""
    try:
        return set(Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").split())
    except OSError:
        return set()


def cpu_supports_bf16() -> bool:
    """Whether this CPU has native bf16 matmul (AVX-512 BF16 or AMX-BF16), read from /proc/cpuinfo."""
    return bool(_cpu_flags() & set(BF16_CPU_FLAGS))


def _onednn_enabled() -> bool:
    """Whether TensorFlow runs oneDNN kernels in this process (built with oneDNN and not switched
    off with ``TF_ENABLE_ONEDNN_OPTS=0``; TensorFlow itself reads that variable)."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return False


def _onednn_layer_norm() -> bool:
    """Whether this process runs oneDNN kernels and has the ``_MklLayerNorm`` op (TensorFlow's x86
    builds, unless ``TF_ENABLE_ONEDNN_OPTS=0``)."""
    try:
        from tensorflow.python.framework import op_def_registry

        return _onednn_enabled() and op_def_registry.get("_MklLayerNorm") is not None
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
