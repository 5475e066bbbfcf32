"""Training-side tools: vocab, synthetic corpus, model building, training, export, evaluation.

May import TensorFlow and bert4keras; the server never imports this package. Importing it imports
``nlp`` first, which sets ``TF_KERAS`` / ``TF_USE_LEGACY_KERAS`` before any submodule loads TensorFlow.
"""

import nlp  # noqa: F401


def missing_modules(names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` that do not import here (an optional extra's tools, named in its error)."""
    missing = []
    for name in names:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing
