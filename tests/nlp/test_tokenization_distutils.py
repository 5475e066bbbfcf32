"""``nlp.tokenization`` is the one door to bert4keras, which imports ``distutils`` (gone in 3.12).

Each test starts a fresh interpreter of the running Python, so the door is checked as a process
meets it at start-up (setuptools' ``distutils-precedence.pth`` included) on every supported version.
"""

import subprocess
import sys
import textwrap

import pytest


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_tokenization_door_gives_bert4keras_distutils_and_tf_keras():
    done = _python(
        """
        import sys
        import nlp.tokenization
        import bert4keras.backend as b4k
        util = sys.modules["distutils.util"]
        print(bool(b4k.is_tf_keras), b4k.keras.__name__, util.__file__)
        """
    )
    assert done.returncode == 0, done.stderr
    is_tf_keras, keras, util_file = done.stdout.split()
    assert is_tf_keras == "True"  # TF_KERAS=1, read through distutils' strtobool
    assert keras.partition(".")[0] == "tf_keras"  # so bert4keras builds on tf.keras 2
    if sys.version_info >= (3, 12):  # no standard-library distutils: setuptools' is the one in use
        assert "setuptools" in util_file


@pytest.mark.parametrize("missing", ["distutils", "distutils.util"])
def test_tokenization_door_names_setuptools_when_distutils_is_missing(missing):
    done = _python(
        f"""
        import sys

        class NoDistutils:  # what Python 3.12+ without setuptools is
            def find_spec(self, name, path=None, target=None):
                if name == {missing!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, NoDistutils())
        import nlp.tokenization
        """
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: bert4keras imports distutils")
    assert "install setuptools" in last
