"""Tests of the library (``nlp/``), one module per stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def session_runtime(model_dir: Path, shapes: list[tuple[int, int]], **changes: Any) -> Any:
    """A ``SessionRuntime`` of ``model_dir`` with the tensor names and task of its manifest, one
    thread of each kind, warmed on ``shapes``; ``changes`` override any argument."""
    from nlp.manifest import load_manifest
    from nlp.runtime import SessionRuntime

    m = load_manifest(model_dir)
    options: dict[str, Any] = {
        "shapes": shapes,
        "input_names": m.input_names,
        "output_names": m.output_names,
        "n_outputs": m.n_outputs,
        "vocab_size": 100,
        "intra_op_threads": 1,
        "inter_op_threads": 1,
        **changes,
    }
    return SessionRuntime(model_dir, **options)
