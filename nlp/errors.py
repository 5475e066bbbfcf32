"""The library's errors: one small hierarchy, each class with a stable ``code``.

The web layer (``app/web/errors.py``) and the batch command translate these; nothing else should need to
know their codes. Codes are part of the public API: never rename one.
"""

from __future__ import annotations


class SpoError(Exception):
    """Base class. ``code`` is stable; ``message`` is for humans."""

    code = "spo_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(SpoError):
    """The caller's input cannot be processed (bad type, invalid unicode...)."""

    code = "invalid_input"


class TextTooLong(InvalidInput):
    """A text is over the configured maximum length in characters."""

    code = "text_too_long"


class ModelLoadError(SpoError):
    """A model directory cannot be loaded (missing file, bad SavedModel, tensor not in graph...)."""

    code = "model_load_error"


class ManifestError(ModelLoadError):
    """``model.json`` is missing a field or has an invalid one; ``field`` names it."""

    code = "invalid_manifest"


class UnsupportedPrecision(ModelLoadError):
    """A precision mode was asked for that this CPU or TensorFlow build cannot run."""

    code = "unsupported_precision"


class RequestTooLarge(SpoError):
    """A request would run more model tokens than allowed; ``tokens`` and ``limit`` say how many."""

    code = "request_too_large"

    def __init__(self, tokens: int, limit: int, *, field: str | None = None) -> None:
        super().__init__(
            f"the texts need {tokens} model tokens (each window with its [CLS] and [SEP]); "
            f"the limit is {limit}",
            field=field,
        )
        self.tokens = tokens
        self.limit = limit


class DeadlineExceeded(SpoError):
    """The work passed its deadline; it was stopped between model calls (``done`` of ``total``)."""

    code = "deadline_exceeded"

    def __init__(self, message: str, *, done: int = 0, total: int = 0) -> None:
        super().__init__(message)
        self.done = done
        self.total = total
