"""What every converter of a model directory checks before it starts: ``spo quantize``, ``spo
export-onnx`` and ``spo export-openvino`` read an fp32 SavedModel directory and write a new one.

One set of checks, so that the three refuse the same inputs with the same words: a source that is
missing, a file, not a model directory, already converted (an onnx or openvino engine directory:
there is no SavedModel in it) or already quantized (int8: quantizing or converting it again would
stack two approximations), and an output that is the source itself (even with ``--force``: the
source would be gone), exists without ``--force``, or is a file. Each tool raises its own error
class, which its command turns into a one-line message.

What may be replaced at all is one rule for every writer of a model directory (``replaceable``:
these three, ``spo train`` and ``spo export``, through ``training.export.staged_model_dir``): an
empty directory or a model directory (one with ``model.json``), never another directory, so that
``--out ~/work`` cannot delete a folder of other files.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from nlp.errors import ManifestError
from nlp.manifest import MANIFEST_NAME, Manifest, load_manifest


def check_conversion(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    force: bool,
    action: str,
    error: type[Exception],
    inputs: Sequence[str | Path] = (),
) -> Manifest:
    """The manifest of ``model_dir``, an fp32 SavedModel directory that may be converted into
    ``out_dir``; else ``error`` saying why and what to ``action`` instead ("quantize", "export").
    ``out_dir`` never holds ``model_dir`` or one of the other ``inputs`` (a calibration file): the
    new directory would replace it, the source model with it.

    >>> check_conversion("no/such/dir", "out", force=False, action="export", error=ValueError)
    Traceback (most recent call last):
    ...
    ValueError: model directory not found: no/such/dir
    """
    source, out = Path(model_dir), Path(out_dir)
    if not source.exists():
        raise error(f"model directory not found: {source}")
    if not source.is_dir():
        raise error(f"{source} is a file, not a model directory")
    try:
        manifest = load_manifest(source)
    except ManifestError as exc:
        raise error(f"{source} is not a usable model directory: {exc}") from None
    if manifest.engine != "tf":
        raise error(
            f"{source} is already an {manifest.engine} model directory (no SavedModel in it); "
            f"{action} the SavedModel directory it was made from"
        )
    if manifest.precision != "fp32":
        made = manifest.quantization or {}
        by = f" by {made.get('tool', '?')} {made.get('tool_version', '')}".rstrip()
        raise error(
            f"{source} is already quantized ({manifest.precision}{by}); {action} its fp32 "
            "parent instead"
        )
    if out.resolve() == source.resolve():
        raise error(f"{out} is the model directory itself: choose another output directory")
    reason = replaceable(out, force=force, inputs=(source, *inputs))
    if reason is not None:
        raise error(reason)
    return manifest


def replaceable(out: str | Path, *, force: bool, inputs: Sequence[str | Path] = ()) -> str | None:
    """Why a model directory may not be written at ``out``, or ``None`` when it may: ``out`` is
    free, or ``force`` and it is an empty directory or a model directory (``model.json`` in it);
    and the directory it goes in can be written (the model is staged beside ``out``: asked by
    making and removing a directory there, so that an hour's training never ends in a traceback).
    Never a symbolic link, a mount point or the current directory (none can be renamed over), nor
    a directory holding one of ``inputs`` (replaced, it took the corpus or weights with it).

    >>> replaceable("no/such/dir", force=False) is None
    True
    """
    out = Path(out)
    if out.is_symlink():
        return f"{out} is a symbolic link: name the directory itself"
    if out.exists():
        where = out.resolve()
        if os.path.ismount(where) or Path.cwd().resolve().is_relative_to(where):
            return (
                f"{out} cannot be replaced (a mount point, or the current directory): write into "
                "a directory inside it"
            )
        for given in inputs:
            if Path(given).resolve().is_relative_to(where):
                return f"{given} is inside {out}, which would be replaced: move it out first"
    base = next((parent for parent in out.parents if parent.exists()), Path("."))
    if not base.is_dir():
        return f"cannot write {out}: {base} is a file, not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.", dir=base))
    except OSError as exc:  # a read-only mount, no permission
        return f"cannot write {out}: {exc.strerror or exc}"
    if not out.exists():
        return None
    if not out.is_dir():
        return f"{out} exists and is not a directory"
    if not force:
        return f"{out} exists (use --force to replace it)"
    if (out / MANIFEST_NAME).is_file() or not any(out.iterdir()):
        return None
    return (
        f"{out} is not a model directory (no {MANIFEST_NAME} in it) and not empty: a model is "
        "never written over other files; choose another directory"
    )
