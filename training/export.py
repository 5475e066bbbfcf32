"""Write a model directory (SavedModel + ``model.json``) from a bert4keras Keras model.

Two SavedModel flavours, both loadable by ``nlp.runtime``:

- ``graph``: the model rebuilt in a TF1-style graph and saved with ``simple_save``; tensors keep their
  Keras names (``Input-Token:0``, ``Input-Segment:0``, ``entity/...``), and the manifest names them.
- ``tf2``: ``tf.saved_model.save`` of the Keras model; tensors are ``serving_default_Input-Token:0``...
  and ``StatefulPartitionedCall:0..n``, found through the ``serving_default`` signature.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tensorflow as tf

from nlp.manifest import write_manifest

EXPORT_MODES = ("graph", "tf2")


def _save_graph(build: Callable[[], Any], weights: list[Any], path: Path) -> dict[str, Any]:
    graph = tf.Graph()
    with graph.as_default():
        session = tf.compat.v1.Session(graph=graph)
        tf.compat.v1.keras.backend.set_session(session)
        try:
            model = build()
            session.run(tf.compat.v1.global_variables_initializer())
            model.set_weights(weights)
            outputs = model.outputs
            tf.compat.v1.saved_model.simple_save(
                session,
                str(path),
                inputs={t.name.split(":")[0]: t for t in model.inputs},
                outputs={name: t for name, t in zip(model.output_names, outputs, strict=True)},
            )
            return {
                "inputs": {"token_ids": model.inputs[0].name, "segment_ids": model.inputs[1].name},
                "outputs": [t.name for t in outputs],
            }
        finally:
            session.close()


def export_model_dir(
    build: Callable[[], Any],
    weights: list[Any],
    out_dir: str | Path,
    manifest: dict[str, Any],
    *,
    mode: str = "graph",
    force: bool = False,
) -> Path:
    """Build the model with ``build()``, load ``weights``, save it with ``manifest`` into ``out_dir``.

    ``build`` is called again inside a fresh graph for the ``graph`` mode, so pass the builder, not a
    model. The directory is written to a temporary sibling and renamed into place at the end, so a
    failed export never leaves a half-written model directory.
    """
    if mode not in EXPORT_MODES:
        raise ValueError(f"mode must be one of {EXPORT_MODES}, got {mode!r}")
    out = Path(out_dir)
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists (use force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        saved = staging / "model"
        document = dict(manifest)
        if mode == "graph":
            document.update(_save_graph(build, weights, saved))
        else:
            model = build()
            model.set_weights(weights)
            tf.saved_model.save(model, str(saved))
            document.pop("inputs", None)
            document.pop("outputs", None)
        write_manifest(saved, document)
        if out.exists():
            shutil.rmtree(out)
        saved.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
