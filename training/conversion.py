"""What every converter of a model directory checks before it starts: ``spo quantize``, ``spo
export-onnx`` and ``spo export-openvino`` read an fp32 SavedModel directory and write a new one.

One set of checks, so that the three refuse the same inputs with the same words: a source that is
missing, a file, not a model directory, already converted (an onnx or openvino engine directory:
there is no SavedModel in it) or already quantized (int8: quantizing or converting it again would
stack two approximations), and an output that is the source itself (even with ``--force``: the
source would be gone), exists without ``--force``, or is a file. Each tool raises its own error
class, which its command turns into a one-line message.
"""

from __future__ import annotations

from pathlib import Path

from nlp.errors import ManifestError
from nlp.manifest import Manifest, load_manifest


def check_conversion(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    force: bool,
    action: str,
    error: type[Exception],
) -> Manifest:
    """The manifest of ``model_dir``, an fp32 SavedModel directory that may be converted into
    ``out_dir``; else ``error`` saying why and what to ``action`` instead ("quantize", "export").

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
    if out.exists() and not force:
        raise error(f"{out} exists (use --force to replace it)")
    if out.exists() and not out.is_dir():
        raise error(f"{out} exists and is not a directory")
    return manifest
