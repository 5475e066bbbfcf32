"""``load_extractor``: the one loader, importable without TensorFlow.

The gunicorn master, the batch command and Spark's driver import this module to hand the loader to
the processes that run the model; ``nlp.pipeline`` (and with it TensorFlow) is imported only when it
runs, in that process. It sits above ``nlp.pipeline`` and ``nlp.config`` (nothing in ``nlp`` imports
it), so the lazy import makes no cycle.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from nlp.config import LoadOptions

if TYPE_CHECKING:
    from nlp.pipeline import Extractor

logger = logging.getLogger(__name__)


def load_extractor(options: LoadOptions) -> Extractor:
    """Validate the model directory, load the SavedModel, warm every bucket shape. The TF session's
    own options (``LoadOptions.tf_session_options``) set for a model of another engine log one
    warning: that engine loads as it would without them.

    A plain module-level function (picklable, so the batch command hands it to spawned workers);
    TensorFlow is imported here, in the process that runs the model, never at import time.
    """
    from nlp.pipeline import Extractor

    extractor = Extractor.load(options)
    ignored = options.tf_session_options()
    if ignored and extractor.manifest.engine != "tf":
        # SessionRuntime.for_model passes them on; the onnx and openvino engines have no such knobs.
        logger.warning(
            "%s runs on the %s engine: %s apply to the TF session only and do nothing here",
            options.model_dir,
            extractor.manifest.engine,
            ", ".join(ignored),
        )
    return extractor
