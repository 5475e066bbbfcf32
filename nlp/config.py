"""What a caller configures, defined once: the model-loading options, the limits and their defaults.

``LoadOptions`` is the one description of how to load a model directory (the service's settings, the
batch command's options and the benchmarks each build one); ``nlp.loader.load_extractor`` is the
one loader. No TensorFlow here: this module is imported by the gunicorn master and the batch command,
which must stay light. A low module: it imports nothing of ``nlp``.

>>> LoadOptions("models/demo", precision="fp64").problems()
["precision must be one of fp32, bf16, int8, got 'fp64'"]
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The package that carries the two demo models as package data: ``models/`` in a checkout (the
# editable install maps it there), ``site-packages/spo_models`` in an installed wheel.
MODELS_PACKAGE = "spo_models"
# What a user can set instead of the embedded default (named in every "no model" error).
MODEL_SETTINGS_HINT = (
    "set SPO_MODEL_DIR (one model) or SPO_MODELS (NAME=DIR,...), or pass --model DIR"
)


def packaged_model_dir(name: str) -> Path:
    """The embedded demo model ``name`` (``demo``, ``ner``), found through package data.

    When the package is not installed (the source tree on ``sys.path`` without ``pip install``) the
    path returned names that and does not exist, so the caller's "not a directory" error says why.
    """
    try:
        root = importlib.resources.files(MODELS_PACKAGE)
    except ModuleNotFoundError:
        return Path(f"<{MODELS_PACKAGE} not installed: no embedded models>") / name
    return Path(str(root.joinpath(name)))


DEMO_MODEL_DIR = packaged_model_dir("demo")
DEMO_NER_MODEL_DIR = packaged_model_dir("ner")
# The project's vocabulary, as the demo model carries it (``spo train`` and ``spo export`` default).
DEMO_VOCAB = DEMO_MODEL_DIR / "vocab.txt"

# The most characters in one text, unless configured otherwise (REST, batch and library alike).
DEFAULT_MAX_TEXT_CHARS = 10_000
# The most tokens (rows x padded length) in one model call (``nlp.bucketing``); None: no cap.
DEFAULT_MAX_BATCH_TOKENS = 4096

# Precision modes the runtime can run (``nlp.runtime`` implements each): name -> what it needs.
# Adding a mode is one line here; every choice list, check and help text is derived from this table.
PRECISIONS: dict[str, str] = {
    "fp32": "float32 on any CPU",
    "bf16": "bfloat16 matmuls; needs a CPU with AVX-512 BF16 or AMX",
    "int8": "an int8 model directory (spo quantize); needs oneDNN and AVX-512 VNNI, AVX-VNNI or AMX",
}
DEFAULT_PRECISION = (
    "fp32"  # what a model.json without "precision" is; options default to the model's
)


def precision_help() -> str:
    """One line naming every precision and what it needs (for ``--help`` and settings)."""
    return "; ".join(f"{name}: {needs}" for name, needs in PRECISIONS.items())


@dataclass(frozen=True)
class LoadOptions:
    """How to load one model directory. Frozen and picklable (it crosses the batch workers' spawn).

    ``precision``: one of ``PRECISIONS``, or ``None`` (the default): the model's own, as its
    model.json says (fp32, or int8 for a ``spo quantize`` directory; ``resolve_precision``).
    ``intra_op_threads`` / ``inter_op_threads``: TensorFlow's thread pools (``None``: TensorFlow's
    default); ``max_text_chars``: longer texts are refused with ``TextTooLong``;
    ``max_batch_tokens``: the most tokens in one model call (``None``: no cap; ``nlp.bucketing``).
    """

    model_dir: Path
    precision: str | None = None
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    max_batch_tokens: int | None = DEFAULT_MAX_BATCH_TOKENS

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_dir", Path(self.model_dir))

    def replace(self, **changes: Any) -> LoadOptions:
        return dataclasses.replace(self, **changes)

    def resolve_precision(self, model_precision: str) -> LoadOptions:
        """These options with the precision to run in: the one asked for, else the model's own
        (``model_precision``, its model.json's). An explicit one that the model cannot run in is
        still refused on load (``Manifest.check_precision``).

        >>> LoadOptions("m").resolve_precision("int8").precision
        'int8'
        >>> LoadOptions("m", precision="bf16").resolve_precision("fp32").precision
        'bf16'
        """
        return self if self.precision is not None else self.replace(precision=model_precision)

    def problems(self) -> list[str]:
        """Every invalid option, in words (empty when all is well). Model files are checked on load."""
        out = []
        if self.precision is not None and self.precision not in PRECISIONS:
            out.append(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.max_text_chars < 1:
            out.append(f"max_text_chars must be positive, got {self.max_text_chars}")
        for name in ("intra_op_threads", "inter_op_threads", "max_batch_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                out.append(f"{name} must be positive, got {value}")
        return out
