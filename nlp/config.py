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
import numbers
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


# The thread plans ``python -m bench threadplan`` measured, by precision (``nlp.runtime`` runs them;
# here, without TensorFlow, so that the service's sizing can count their sessions): ``(up to this many
# tokens, intra-op threads)`` pairs by ascending length; a call of at most that many padded tokens runs
# on a second session of the frozen graph with that many threads (capped by ``intra_op_threads``).
# RBT6, AMD EPYC, 2 idle cores, 2026-12-03 21:29: one thread is faster at every length up to 128 in int8
# (16 tokens 16.9 vs 25.8 ms, 128 tokens 59.4 vs 69.8), at none in bf16 or frozen fp32. Opt-in
# (``LoadOptions.short_call_threads``): the one-thread session holds the weights again, 478 MiB RSS in
# int8 (BENCHMARKS.md, issue 24 part 3); fp32 is served from its variables, where no plan applies.
ThreadPlan = tuple[tuple[int, int], ...]
SHORT_CALL_PLANS: dict[str, ThreadPlan] = {"int8": ((128, 1),)}

# The exact graph rewrites the TF session applies only when asked (``nlp.tf_graph.OPT_IN_REWRITES``,
# which tests compare to this table): name -> what it does. Frozen graphs only (bf16, int8).
EXTRA_REWRITES: dict[str, str] = {
    "fuse_sibling_dense": "Dense layers over one input (attention's Q, K, V) as one matmul; exact, "
    "not faster on RBT6",
}
# The options only the TF session runs (the onnx and openvino engines ignore them, with a warning).
TF_SESSION_OPTIONS = ("short_call_threads", "extra_rewrites")


def plan_sessions(plan: ThreadPlan, intra_op_threads: int | None) -> tuple[int, ...]:
    """The thread counts of the extra sessions ``plan`` makes under an upper bound of
    ``intra_op_threads`` (none without a bound, or at one thread: every call already runs on one).

    >>> plan_sessions(((128, 1),), 2), plan_sessions(((128, 1),), 1), plan_sessions(((16, 1),), None)
    ((1,), (), ())
    """
    if intra_op_threads is None:
        return ()
    return tuple(sorted({t for _, t in plan if t < intra_op_threads}))


def precision_help() -> str:
    """One line naming every precision and what it needs (for ``--help`` and settings)."""
    return "; ".join(f"{name}: {needs}" for name, needs in PRECISIONS.items())


def _positive_int(value: object) -> bool:
    """An integer of at least 1 (numpy's too; not a bool, a float or a string of digits).

    >>> import numpy as np
    >>> [_positive_int(v) for v in (1, np.int64(2), 0, "2", True, 2.0)]
    [True, True, False, False, False, False]
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 1


@dataclass(frozen=True)
class LoadOptions:
    """How to load one model directory. Frozen and picklable (it crosses the batch workers' spawn).

    ``precision``: one of ``PRECISIONS``, or ``None`` (the default): the model's own, as its
    model.json says (fp32, or int8 for a ``spo quantize`` directory; ``resolve_precision``).
    ``intra_op_threads`` / ``inter_op_threads``: TensorFlow's thread pools (``None``: TensorFlow's
    default); ``max_text_chars``: longer texts are refused with ``TextTooLong``;
    ``max_batch_tokens``: the most tokens in one model call (``None``: no cap; ``nlp.bucketing``).

    TF session only (``TF_SESSION_OPTIONS``; other engines ignore them with a warning), both off by
    default for measured reasons (BENCHMARKS.md, issue 24 part 3): ``short_call_threads``: run short
    calls on a second session with the thread plan measured for the precision (``SHORT_CALL_PLANS``;
    needs ``intra_op_threads``, the plan's upper bound; a precision without a plan, or a graph served
    from its variables, runs without, with a log line); ``extra_rewrites``: names of
    ``EXTRA_REWRITES`` to apply to a frozen graph.
    """

    model_dir: Path
    precision: str | None = None
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    max_batch_tokens: int | None = DEFAULT_MAX_BATCH_TOKENS
    short_call_threads: bool = False
    extra_rewrites: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        rewrites = self.extra_rewrites
        object.__setattr__(
            self, "extra_rewrites", (rewrites,) if isinstance(rewrites, str) else tuple(rewrites)
        )

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

    def thread_plan(self, precision: str) -> ThreadPlan:
        """The thread plan to run ``precision`` with: its measured one when ``short_call_threads``
        is on, else none (``()``, also for a precision with no measured plan).

        >>> LoadOptions("m", short_call_threads=True).thread_plan("int8")
        ((128, 1),)
        >>> LoadOptions("m", short_call_threads=True).thread_plan("bf16")
        ()
        """
        return SHORT_CALL_PLANS.get(precision, ()) if self.short_call_threads else ()

    def tf_session_options(self) -> list[str]:
        """The TF-session-only options that are set, as ``name=value`` (empty when none is)."""
        out = []
        if self.short_call_threads:
            out.append("short_call_threads=on")
        if self.extra_rewrites:
            out.append(f"extra_rewrites={','.join(self.extra_rewrites)}")
        return out

    def problems(self) -> list[str]:
        """Every invalid option, in words (empty when all is well). Model files are checked on load."""
        out = []
        if self.precision is not None and self.precision not in PRECISIONS:
            out.append(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        # Integers, not their spellings: a "2" read from an environment is the caller's to parse.
        if not _positive_int(self.max_text_chars):
            out.append(f"max_text_chars must be a positive integer, got {self.max_text_chars!r}")
        for name in ("intra_op_threads", "inter_op_threads", "max_batch_tokens"):
            value = getattr(self, name)
            if value is not None and not _positive_int(value):
                out.append(f"{name} must be a positive integer (or None), got {value!r}")
        unknown = [r for r in self.extra_rewrites if r not in EXTRA_REWRITES]
        if unknown:
            out.append(
                f"extra_rewrites must be among {', '.join(EXTRA_REWRITES)}, got "
                f"{', '.join(map(repr, unknown))}"
            )
        if self.short_call_threads and self.intra_op_threads is None:
            out.append("short_call_threads needs intra_op_threads (the thread plan's upper bound)")
        return out
