"""Input records: ``.txt`` lines and ``.jsonl`` objects, gzip or not, read as a stream of bytes lines.

Every input line is one record, so the output has exactly one line per input line. A ``.txt`` record's
id is its line number (1-based); a ``.jsonl`` record's id is its id field (a string, a number, a boolean
or null: an array or an object makes the record an ``invalid_input`` error), or its line number when the
field is absent or the line cannot be parsed. With several inputs the id is ``"<input>:<id>"``.
Parsing is separate from reading so that ``--resume`` and ``--shard`` skip lines without parsing them.

A stream (stdin, or a pipe or FIFO named as a path: ``<(zcat a.gz)``) is read once, front to back: it
is never measured, sampled for the resume fingerprint, counted for the progress bar, or sought.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from nlp.errors import InvalidInput, SpoError, TextTooLong
from nlp.validation import json_type

FORMATS = ("txt", "jsonl")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_SAMPLE = 1 << 20  # bytes hashed at each end of an input for the resume fingerprint


class InvalidJson(InvalidInput):
    """A ``.jsonl`` line that is not a UTF-8 JSON object (same code as the REST API's bad body)."""

    code = "invalid_json"


class InputError(Exception):
    """An input cannot be read at all (missing file, corrupt gzip stream): the run stops."""


@dataclass(frozen=True)
class Source:
    """One input as named on the command line (``-`` is stdin)."""

    name: str
    format: str

    @property
    def is_stdin(self) -> bool:
        return self.name == "-"

    @property
    def is_stream(self) -> bool:
        """Whether it can be read only once, as stdin: ``-``, or a pipe, a FIFO or a character device
        named as a path (``<(zcat a.gz)``, ``mkfifo``), which has no size and cannot be reopened."""
        if self.is_stdin:
            return True
        try:
            mode = os.stat(self.name).st_mode
        except OSError:
            return False  # opened as a file, which says why it cannot be
        return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def source_for(name: str, fmt: str = "auto") -> Source:
    """The input ``name`` with its format: given, or from the suffix (``.gz`` looked through)."""
    if fmt != "auto":
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
        return Source(name, fmt)
    if name == "-":
        return Source(name, "txt")
    lowered = name.lower().removesuffix(".gz")
    if lowered.endswith(".txt"):
        return Source(name, "txt")
    if lowered.endswith(JSONL_SUFFIXES):
        return Source(name, "jsonl")
    raise ValueError(
        f"{name}: cannot tell the format from the name; use --input-format txt or jsonl"
    )


@dataclass(frozen=True, slots=True)
class Record:
    """One input line, parsed: a text to extract from, or the error that replaces its output."""

    id: Any
    text: str | None
    error: SpoError | None = None


def open_binary(source: Source, stdin: BinaryIO | None = None) -> BinaryIO:
    """A binary stream of ``source``'s bytes, gunzipped when they start with the gzip magic; a UTF-16
    or UTF-32 text (its byte order mark) is an ``InputError`` naming it, not every line an error."""
    if source.is_stdin:
        return _utf8(source, _unzipped(stdin if stdin is not None else sys.stdin.buffer))
    try:
        raw = open(source.name, "rb")  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise InputError(f"{source.name}: {exc.strerror or exc}") from exc
    if source.is_stream:
        return _utf8(source, _unzipped(raw, owned=True))
    head = raw.read(2)
    raw.seek(0)
    if head == GZIP_MAGIC:
        raw.close()
        return _utf8(source, gzip.open(source.name, "rb"))  # type: ignore[arg-type]
    return _utf8(source, raw)


_WIDE_BOMS = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")
WIDE_BOM_BYTES = 4  # the bytes wide_text_problem needs to see


def wide_text_problem(name: str, head: bytes) -> str | None:
    """Why a file whose text starts with ``head`` is not read (None: it is): a UTF-16 or UTF-32
    byte order mark (``iconv`` and Windows' "Unicode" save such files), which would make every line
    an error record. The batch command and spark-extract say it alike.

    >>> wide_text_problem("a.txt", "x".encode("utf-16")) is not None, wide_text_problem("a.txt", b"x")
    (True, None)
    """
    if not head.startswith(_WIDE_BOMS):
        return None
    return (
        f"{name} is UTF-16 or UTF-32 (its byte order mark says so), not UTF-8: convert it first, "
        "e.g. iconv -f UTF-16 -t UTF-8"
    )


def _utf8(source: Source, stream: BinaryIO) -> BinaryIO:
    """``stream``, unless its text is UTF-16 or UTF-32 (``wide_text_problem``): then closed, and an
    ``InputError`` saying what to do."""
    head = stream.peek(WIDE_BOM_BYTES)[:WIDE_BOM_BYTES]  # type: ignore[attr-defined]
    problem = wide_text_problem("stdin (-)" if source.is_stdin else source.name, head)
    if problem is not None:
        stream.close()
        raise InputError(problem)
    return stream


def _unzipped(stream: Any, *, owned: bool = False) -> BinaryIO:
    """A stream read once, front to back, gunzipped when its first bytes are the gzip magic (peeked
    at, never sought); ``owned``: closing the result closes ``stream`` too."""
    if not hasattr(stream, "peek"):
        stream = io.BufferedReader(stream)
    if stream.peek(2)[:2] != GZIP_MAGIC:
        return stream  # type: ignore[no-any-return]
    if owned:
        return _ClosingGzipFile(stream)  # type: ignore[return-value]
    return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[return-value]


class _ClosingGzipFile(gzip.GzipFile):
    """A ``GzipFile`` that closes the stream under it too (``GzipFile`` leaves a ``fileobj`` open)."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def iter_lines(stream: BinaryIO, limit: int) -> Iterator[bytes | None]:
    """Each line's bytes (newline included), or ``None`` for a line over ``limit`` bytes (skipped).

    Memory stays bounded whatever the input: an overlong line is read in pieces and dropped.
    """
    first = True
    while True:
        # A BOM before the first line is no part of it: read past it, or the limit would cut the
        # line 3 bytes short and its rest would be taken for more lines.
        line = stream.readline(limit + 1 + (len(_BOM) if first else 0))
        if not line:
            return
        if first:
            line = line.removeprefix(_BOM)
            first = False
            if not line:  # a BOM and nothing else: no line at all
                return
        if len(line) > limit and not line.endswith(b"\n"):
            while True:
                rest = stream.readline(1 << 20)
                if not rest or rest.endswith(b"\n"):
                    break
            yield None
        else:
            yield line


def count_lines(source: Source) -> int:
    """Records in a file input (a final line without a newline counts); read once, in blocks."""
    with open_binary(source) as stream:
        count, last, head = 0, b"\n", b""
        for block in iter(lambda: stream.read(1 << 20), b""):
            head = head or block[: len(_BOM) + 1]  # the BOM alone, or more than it
            count += block.count(b"\n")
            last = block[-1:]
        return 0 if head == _BOM else count + (last != b"\n")  # a BOM alone: no line (iter_lines)


def fingerprint(source: Source) -> dict[str, Any]:
    """What ``--resume`` compares: size and a hash of the first and last MiB (a stream, stdin or a
    pipe: its name only, as it can be read only once)."""
    if source.is_stream:
        return {"name": source.name}
    path = Path(source.name)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        digest.update(fh.read(_SAMPLE))
        if size > _SAMPLE:
            fh.seek(max(_SAMPLE, size - _SAMPLE))
            digest.update(fh.read(_SAMPLE))
    return {"name": source.name, "size": size, "sample_sha256": digest.hexdigest()}


def line_limit(fmt: str, max_text_chars: int) -> int:
    """Bytes above which a line cannot hold a text within ``max_text_chars``.

    UTF-8 takes at most 4 bytes per character; a JSON escape (``\\ud83d\\ude00``) up to 12, plus room
    for the id and other fields.
    """
    if fmt == "txt":
        return 4 * max_text_chars + 2
    return 12 * max_text_chars + (1 << 20)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(number: str) -> float:
    """A JSON number as a float; one out of a float's range (``1e400``) is refused, as ``NaN`` is,
    rather than read as ``inf`` and written back as ``Infinity``, which is not JSON."""
    value = float(number)
    if math.isinf(value):
        raise ValueError(f"the number {number} is out of range")
    return value


ID_TYPES = (str, int, float, bool, type(None))  # an id is a JSON scalar: written back as it came


def parse_line(
    source: Source,
    line_no: int,
    raw: bytes | None,
    *,
    text_field: str = "text",
    id_field: str = "id",
    prefix_ids: bool = False,
) -> Record:
    """The record of one line (``raw`` is ``None`` for a line over the byte limit)."""
    record = _parse(source, line_no, raw, text_field, id_field)
    if prefix_ids:
        return Record(f"{source.name}:{_id_str(record.id)}", record.text, record.error)
    return record


def _id_str(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _parse(
    source: Source, line_no: int, raw: bytes | None, text_field: str, id_field: str
) -> Record:
    if raw is None:
        return Record(line_no, None, TextTooLong(f"line {line_no} is too long to hold a text"))
    if raw.endswith(b"\n"):
        raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        error = InvalidJson if source.format == "jsonl" else InvalidInput
        return Record(line_no, None, error(f"line {line_no} is not valid UTF-8 (byte {exc.start})"))
    if source.format == "txt":
        return Record(line_no, line)
    try:
        doc = json.loads(line, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:
        detail = (
            exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or "too deeply nested"
        )
        return Record(line_no, None, InvalidJson(f"line {line_no} is not valid JSON: {detail}"))
    if not isinstance(doc, dict):
        return Record(
            line_no,
            None,
            InvalidJson(f"line {line_no} is JSON {type(doc).__name__}, not an object"),
        )
    record_id = doc.get(id_field, line_no)
    if not isinstance(record_id, ID_TYPES):  # an array or an object, nested without bound
        return Record(
            line_no,
            None,
            InvalidInput(
                f"line {line_no}: {id_field} must be a string, a number, a boolean or null, got "
                f"{json_type(record_id)}",
                field=id_field,
            ),
        )
    text = doc.get(text_field)
    if text_field not in doc:
        return Record(
            record_id,
            None,
            InvalidInput(f"line {line_no}: missing field {text_field!r}", field=text_field),
        )
    if not isinstance(text, str):
        return Record(
            record_id,
            None,
            InvalidInput(
                f"line {line_no}: {text_field} must be a string, got {json_type(text)}",
                field=text_field,
            ),
        )
    return Record(record_id, text)


def is_same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
