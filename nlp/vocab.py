"""The vocab file, read and checked in one place: one token a line, its id the line's index.

A line's token is bert4keras's (``load_vocab``): its first whitespace-separated word, or the
stripped line when it has none (a blank line is the token ``""``); lines end at ``\\n``, ``\\r``
or ``\\r\\n``. bert4keras gives a token the id ``len(dict)`` as it reads it, so a token written
twice (two blank lines included) moves to the later line and every token after it one id down: the
model would see other tokens than it was trained on. ``read_vocab`` refuses that, a file that is
not UTF-8, an empty one and one without the special tokens, each with the file (and the lines)
named. No TensorFlow: ``nlp.manifest`` checks the vocab with it, ``nlp.tokenization`` reads it.

>>> [_token(line) for line in ("中\\n", "##ab 12\\n", " \\n")]
['中', '##ab', '']
"""

from __future__ import annotations

import io
from pathlib import Path

from nlp.errors import ModelLoadError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")


def _token(line: str) -> str:
    """The token of one vocab line (bert4keras's ``load_vocab`` rule)."""
    words = line.split()
    return words[0] if words else line.strip()


def _shown(token: str) -> str:
    return "a blank line" if token == "" else f"token {token!r}"


def _decoded(path: Path) -> str:
    """The file's text; ``ModelLoadError`` naming it if it cannot be read or is not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read the vocab: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ModelLoadError(
            f"{path}: the vocab is not UTF-8 text (line {line}: {exc.reason})"
        ) from None


def read_vocab(path: str | Path) -> dict[str, int]:
    """Token -> id of the vocab file at ``path``: ids ``0..n-1`` in line order, each token once.

    ``ModelLoadError`` naming the file if it cannot be read, is not UTF-8, is empty, repeats a
    token (naming both lines) or lacks one of ``SPECIAL_TOKENS``.
    """
    path = Path(path)
    vocab: dict[str, int] = {}
    repeated: list[tuple[str, int, int]] = []
    for index, line in enumerate(io.StringIO(_decoded(path), newline=None)):
        token = _token(line)
        if token in vocab:
            repeated.append((token, vocab[token] + 1, index + 1))
        else:
            vocab[token] = index
    if not vocab:
        raise ModelLoadError(f"{path}: the vocab is empty")
    if repeated:
        token, first, again = repeated[0]
        more = f" ({len(repeated)} repeated lines in all)" if len(repeated) > 1 else ""
        raise ModelLoadError(
            f"{path}: {_shown(token)} on lines {first} and {again}{more}: each token must be "
            f"written once (every id after line {again} would be off by one)"
        )
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing and next(iter(vocab)).startswith("\ufeff"):
        raise ModelLoadError(
            f"{path}: the vocab starts with a byte-order mark (U+FEFF), which would be part of "
            f"its first token ({_shown(next(iter(vocab)))}): save it as UTF-8 without one"
        )
    if missing:
        raise ModelLoadError(
            f"{path}: the vocab lacks {', '.join(missing)} (every vocab needs "
            f"{', '.join(SPECIAL_TOKENS)})"
        )
    return vocab
