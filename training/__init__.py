"""Training-side tools: vocab, synthetic corpus, model building, training, export, evaluation.

May import TensorFlow and bert4keras; the server never imports this package. Importing it imports
``nlp`` first, which sets ``TF_KERAS`` / ``TF_USE_LEGACY_KERAS`` before any submodule loads TensorFlow.
"""

import nlp  # noqa: F401
