"""``nlp``: the process policy for TensorFlow (its start-up noise filter)."""

import os
import sys

import nlp
from nlp import quiet_tensorflow

ONEDNN = b"I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on. You may see...\n"
NO_DRIVER = b"I0000 00:00:1.0 1 cudart_stub.cc:31] Could not find cuda drivers on your machine\n"
CUINIT = b"E0000 00:00:1.0 1 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error\n"


def test_init_quiet_tensorflow_drops_known_noise_and_keeps_the_rest(capfd, monkeypatch):
    monkeypatch.setattr(nlp, "_no_cuda_driver", False)
    with quiet_tensorflow():
        os.write(2, ONEDNN + b"a real problem\n")
        print("a Python warning", file=sys.stderr)
    err = capfd.readouterr().err
    assert "oneDNN" not in err
    assert "a real problem" in err and "a Python warning" in err


def test_init_quiet_tensorflow_drops_cuinit_only_without_a_driver(capfd, monkeypatch):
    monkeypatch.setattr(nlp, "_no_cuda_driver", False)
    with quiet_tensorflow():
        os.write(2, CUINIT)
    assert "cuInit" in capfd.readouterr().err  # a GPU machine's real failure shows
    with quiet_tensorflow():
        os.write(2, NO_DRIVER)
    with quiet_tensorflow():
        os.write(2, CUINIT)
    assert capfd.readouterr().err == ""
