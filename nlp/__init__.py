"""spo-service extraction library: text in, entities and (subject, predicate, object) triples out.

No Flask and no environment reads here. This is the one place that sets TensorFlow's process policy:

- the pair of switches bert4keras needs to run on tf.keras 2 (``TF_KERAS``, ``TF_USE_LEGACY_KERAS``),
  which must be set before TensorFlow is first imported (every TensorFlow import in the project comes
  after ``import nlp``), and TensorFlow's C++ log level (``TF_CPP_MIN_LOG_LEVEL``, warnings and up);
- ``TF_OVERRIDE_GLOBAL_THREADPOOL``: each session gets its own intra-op pool of the size its config
  asks, instead of every session sharing the pool the first one made (``nlp.runtime``'s thread plan
  runs short calls on a one-thread session beside the main one). A process with one session is
  unchanged; read by TensorFlow once, when it creates its first device;
- ``quiet_tensorflow()``, around the first TensorFlow import and the first session: the pip build of
  TensorFlow probes for CUDA and prints its findings (``Could not find cuda drivers``, ``failed call to
  cuInit``) and a oneDNN note through a logger that ignores ``TF_CPP_MIN_LOG_LEVEL``. Those known lines
  are dropped, so the first lines a user sees are the project's own; every other line is passed on. A
  failed ``cuInit`` is dropped only once TensorFlow has said this machine has no CUDA driver, so on a
  GPU machine (the ``tensorflow[and-cuda]`` variant) a real CUDA failure still shows.
"""

from __future__ import annotations

import contextlib
import os as _os
import re as _re
import sys as _sys
import tempfile as _tempfile
from collections.abc import Iterator

_os.environ["TF_KERAS"] = "1"
_os.environ["TF_USE_LEGACY_KERAS"] = "1"
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_os.environ.setdefault("TF_OVERRIDE_GLOBAL_THREADPOOL", "1")

# TensorFlow's start-up lines that say nothing to a user of a CPU service.
_NOISE = _re.compile(
    rb"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|oneDNN custom operations are on"
    rb"|Could not find cuda drivers on your machine"
    rb"|Unable to register cu(?:DNN|FFT|BLAS) factory"
    rb"|computation placer already registered"
    rb"|TF-TRT Warning: Could not find TensorRT"
    rb"|This TensorFlow binary is optimized to use available CPU instructions"
    rb"|rebuild TensorFlow with the appropriate compiler flags"
)

_NO_DRIVER = b"Could not find cuda drivers on your machine"
_CUDA_PROBE = _re.compile(rb"failed call to cuInit")
_no_cuda_driver = False

__all__ = ["quiet_tensorflow"]


@contextlib.contextmanager
def quiet_tensorflow() -> Iterator[None]:
    """Drop TensorFlow's known start-up noise from stderr while the block runs.

    TensorFlow writes it from C++ straight to file descriptor 2, so the descriptor is pointed at a
    temporary file for the block; afterwards every captured line that is not noise is written back.
    """
    _sys.stderr.flush()
    saved = _os.dup(2)
    with _tempfile.TemporaryFile() as captured:
        _os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            _sys.stderr.flush()
            _os.dup2(saved, 2)
            _os.close(saved)
            captured.seek(0)
            lines = captured.readlines()
            global _no_cuda_driver
            _no_cuda_driver = _no_cuda_driver or any(_NO_DRIVER in line for line in lines)
            kept = [
                line
                for line in lines
                if not _NOISE.search(line) and not (_no_cuda_driver and _CUDA_PROBE.search(line))
            ]
            if kept:
                _os.write(2, b"".join(kept))
