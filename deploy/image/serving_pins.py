"""The image's pins: the serving dependencies of ``pyproject.toml`` at the versions of ``requirements.lock``.

Run by the Dockerfile's ``pins`` stage (standard library only, before anything is installed)::

    python3 serving_pins.py pyproject.toml requirements.lock tensorflow-cpu OUT_DIR

Only its output reaches the stage that installs the pins, so an edit of ``pyproject.toml`` that leaves
the pins as they are rebuilds no TensorFlow layer.

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
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)==([^\s;\\]+)\s*(;[^#\\]*)?")

# {canonical name: [(version, marker), ...]}: a universal lock may pin one package per environment.
Lock = dict[str, list[tuple[str, str]]]


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


def read_lock(text: str) -> Lock:
    """Every ``NAME==VERSION [; marker]`` line (comments, hashes and options skipped).

    >>> read_lock("numpy==2.4.6 ; python_version < '3.12'\\n    # via tensorflow\\nflask==3.1.3")
    {'numpy': [('2.4.6', "python_version < '3.12'")], 'flask': [('3.1.3', '')]}
    """
    pins: Lock = {}
    for line in text.splitlines():
        match = _PIN.match(line.strip())
        if match:
            marker = (match[3] or "").removeprefix(";").strip()
            pins.setdefault(canonical(match[1]), []).append((match[2], marker))
    return pins


def _lines(name: str, pins: list[tuple[str, str]], marker: str = "") -> list[str]:
    """``name==version`` for each pin, with its marker and ``marker`` (the dependency's) joined."""
    out = []
    for version, own in pins:
        markers = [f"({m})" for m in (marker, own) if m]
        out.append(f"{name}=={version}" + (f" ; {' and '.join(markers)}" if markers else ""))
    return out


def serving_pins(
    dependencies: list[str], lock: Lock, tensorflow: str = "tensorflow-cpu"
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
    serving = _lines(tensorflow, lock["tensorflow"])
    for name, dependency in zip(names, dependencies, strict=True):
        if name not in ("tensorflow", "tf-keras"):
            marker = dependency.split(";", 1)[1].strip() if ";" in dependency else ""
            serving += _lines(name, lock[name], marker)
    constraints = [
        line
        for name, pins in sorted(lock.items())
        if name not in ("tensorflow", "tf-keras")
        for line in _lines(name, pins)
    ]
    nodeps = [*_lines("tf-keras", lock["tf-keras"]), BERT4KERAS]
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
