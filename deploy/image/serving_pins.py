"""The image's pins: the serving dependencies of ``pyproject.toml`` at the versions of ``requirements.lock``.

Run by the Dockerfile's build stage (standard library only, before anything is installed)::

    python3 deploy/image/serving_pins.py pyproject.toml requirements.lock tensorflow-cpu OUT_DIR

and writes three pip requirement files into OUT_DIR:

- ``serving.txt``: the project's runtime dependencies, without TensorFlow and tf-keras, plus the
  chosen TensorFlow distribution (``tensorflow-cpu`` or ``tensorflow``) at the locked TensorFlow version;
- ``constraints.txt``: every other exact pin of the lock, so that what they bring in is pinned too
  (developer tools in the lock are constraints only: nothing installs them);
- ``nodeps.txt``: what goes in with ``--no-deps``: tf-keras (it declares ``tensorflow``, which would
  pull the full wheel beside ``tensorflow-cpu``) and bert4keras 0.11.5 (it declares keras<=2.3.1).

A dependency the lock does not pin is an error: the image installs nothing unpinned.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

BERT4KERAS = "bert4keras==0.11.5"
TENSORFLOW_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)==(\S+)")


def canonical(name: str) -> str:
    """PEP 503 name: ``tf_keras`` and ``TF.Keras`` are both ``tf-keras``.

    >>> canonical("Flask_Cors")
    'flask-cors'
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The canonical project name of a requirement string (``flask==3.1.3`` -> ``flask``)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9_.-]*", requirement.strip())
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return canonical(match[0])


def read_lock(text: str) -> dict[str, str]:
    """``{canonical name: version}`` of every ``NAME==VERSION`` line (comments and options skipped)."""
    pins: dict[str, str] = {}
    for line in text.splitlines():
        match = _PIN.match(line.strip())
        if match:
            pins[canonical(match[1])] = match[2]
    return pins


def serving_pins(
    dependencies: list[str], lock: dict[str, str], tensorflow: str = "tensorflow-cpu"
) -> tuple[list[str], list[str], list[str]]:
    """``(serving, constraints, nodeps)`` requirement lines; see the module docstring."""
    if tensorflow not in TENSORFLOW_DISTRIBUTIONS:
        raise ValueError(
            f"TENSORFLOW must be one of {TENSORFLOW_DISTRIBUTIONS}, got {tensorflow!r}"
        )
    names = [requirement_name(d) for d in dependencies]
    missing = [n for n in names if n not in lock]
    if missing:
        raise ValueError(f"not pinned in the lock: {', '.join(missing)}")
    if "tensorflow" not in names or "tf-keras" not in names:
        raise ValueError("the project's dependencies name no tensorflow or no tf-keras")
    serving = [f"{tensorflow}=={lock['tensorflow']}"]
    serving += [f"{n}=={lock[n]}" for n in names if n not in ("tensorflow", "tf-keras")]
    constraints = [
        f"{n}=={v}" for n, v in sorted(lock.items()) if n not in ("tensorflow", "tf-keras")
    ]
    nodeps = [f"tf-keras=={lock['tf-keras']}", BERT4KERAS]
    return serving, constraints, nodeps


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    pyproject, lock_file, tensorflow, out = argv
    dependencies = tomllib.loads(Path(pyproject).read_text(encoding="utf-8"))["project"][
        "dependencies"
    ]
    try:
        files = serving_pins(
            dependencies, read_lock(Path(lock_file).read_text(encoding="utf-8")), tensorflow
        )
    except ValueError as exc:
        print(f"serving_pins: {exc}", file=sys.stderr)
        return 1
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, lines in zip(("serving.txt", "constraints.txt", "nodeps.txt"), files, strict=True):
        (out_dir / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
