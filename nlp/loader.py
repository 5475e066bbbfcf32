"""``load_extractor``: the one loader, importable without TensorFlow.

The gunicorn master, the batch command and Spark's driver import this module to hand the loader to
the processes that run the model; ``nlp.pipeline`` (and with it TensorFlow) is imported only when it
runs, in that process. It sits above ``nlp.pipeline`` and ``nlp.config`` (nothing in ``nlp`` imports
it), so the lazy import makes no cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlp.config import LoadOptions

if TYPE_CHECKING:
    from nlp.pipeline import Extractor


def load_extractor(options: LoadOptions) -> Extractor:
    """Validate the model directory, load the SavedModel, warm every bucket shape.

    A plain module-level function (picklable, so the batch command hands it to spawned workers);
    TensorFlow is imported here, in the process that runs the model, never at import time.
    """
    from nlp.pipeline import Extractor

    return Extractor.load(options)
