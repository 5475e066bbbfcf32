"""spo-service extraction library: text in, entities and (subject, predicate, object) triples out.

No Flask and no environment reads here. The one process-wide policy this package sets is the pair of
switches bert4keras needs to run on tf.keras 2 (``TF_KERAS``, ``TF_USE_LEGACY_KERAS``): they must be set
before TensorFlow is first imported, and every TensorFlow import in the project goes through this
package, so this is the one place that sets them.
"""

import os as _os

_os.environ["TF_KERAS"] = "1"
_os.environ["TF_USE_LEGACY_KERAS"] = "1"
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__all__: list[str] = []
