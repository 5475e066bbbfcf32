"""Input reading and parsing: formats, ids, error records, gzip, BOM, CRLF, overlong lines."""

from __future__ import annotations

import gzip
import io
import os
from pathlib import Path

import pytest

from app.batch.records import (
    InputError,
    Source,
    count_lines,
    fingerprint,
    iter_lines,
    line_limit,
    open_binary,
    parse_line,
    source_for,
)


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("a.txt", "txt"),
        ("a.TXT.gz", "txt"),
        ("a.jsonl", "jsonl"),
        ("a.ndjson.gz", "jsonl"),
        ("-", "txt"),
    ],
)
def test_records_format_from_suffix(name: str, fmt: str) -> None:
    assert source_for(name).format == fmt


def test_records_unknown_suffix_needs_format() -> None:
    with pytest.raises(ValueError, match="--input-format"):
        source_for("data.csv")
    assert source_for("data.csv", "jsonl").format == "jsonl"


TXT = Source("a.txt", "txt")
JSONL = Source("a.jsonl", "jsonl")


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"\xe5\x8c\x97\xe4\xba\xac\n", "北京"),
        (b"crlf\r\n", "crlf"),
        (b"no newline", "no newline"),
        (b"\n", ""),
        (b"  spaces kept \n", "  spaces kept "),
        ("e\u0301 😀\u3000，\n".encode(), "e\u0301 😀\u3000，"),
    ],
)
def test_records_txt_line_is_text_and_id_is_line_number(raw: bytes, text: str) -> None:
    record = parse_line(TXT, 7, raw)
    assert (record.id, record.text, record.error) == (7, text, None)


def test_records_txt_invalid_utf8_is_error_record() -> None:
    record = parse_line(TXT, 3, b"ok \xff\n")
    assert record.id == 3 and record.error is not None and record.error.code == "invalid_input"


@pytest.mark.parametrize(
    ("raw", "code", "record_id"),
    [
        (b'{"id": "a", "text": "x"}', None, "a"),
        (b'{"text": "x"}', None, 5),  # no id: the line number
        (b'{"id": null, "text": "x"}', None, None),
        (b'{"id": 9, "text": "x", "extra": [1, 2]}', None, 9),
        (b"not json", "invalid_json", 5),
        (b"", "invalid_json", 5),
        (b"[1, 2]", "invalid_json", 5),
        (b'"text"', "invalid_json", 5),
        (b'{"id": NaN, "text": "x"}', "invalid_json", 5),
        (b"[" * 100_000 + b"]" * 100_000, "invalid_json", 5),
        (b'{"id": "a", "text": "x"', "invalid_json", 5),
        (b'{"id": "a"}', "invalid_input", "a"),
        (b'{"id": "a", "text": null}', "invalid_input", "a"),
        (b'{"id": "a", "text": ["x"]}', "invalid_input", "a"),
        (b'{"id": "a", "text": 12}', "invalid_input", "a"),
        (b'\xff{"text": "x"}', "invalid_json", 5),
        (b'{"id": true, "text": "x"}', None, True),
        (b'{"id": 1.5e300, "text": "x"}', None, 1.5e300),
        # An id is a JSON scalar: a nested one crashed the checkpoint (RecursionError) at 500 levels.
        (b'{"id": ' + b"[" * 500 + b"]" * 500 + b', "text": "x"}', "invalid_input", 5),
        (b'{"id": [1, 2], "text": "x"}', "invalid_input", 5),
        (b'{"id": {"a": 1}, "text": "x"}', "invalid_input", 5),
        # A number out of a float's range was read as inf and written as Infinity (not JSON).
        (b'{"id": 1e400, "text": "x"}', "invalid_json", 5),
        (b'{"id": -1e400, "text": "x"}', "invalid_json", 5),
        (b'{"id": "a", "text": "x", "score": 1E+999}', "invalid_json", 5),
    ],
)
def test_records_jsonl_parsing(raw: bytes, code: str | None, record_id: object) -> None:
    record = parse_line(JSONL, 5, raw + b"\n")
    assert record.id == record_id
    assert (record.error.code if record.error else None) == code
    if code is None:
        assert record.text == "x"


def test_records_jsonl_custom_fields_and_prefixed_ids() -> None:
    record = parse_line(
        JSONL, 1, b'{"doc": 4, "body": "x"}', text_field="body", id_field="doc", prefix_ids=True
    )
    assert (record.id, record.text) == ("a.jsonl:4", "x")


def test_records_jsonl_lone_surrogate_text_is_kept_for_the_extractor_to_refuse() -> None:
    record = parse_line(JSONL, 1, b'{"text": "\\ud800x"}')
    assert record.text == "\ud800x" and record.error is None


def test_records_overlong_line_is_dropped_in_pieces() -> None:
    data = b"short\n" + b"x" * 5000 + b"\nafter\n"
    lines = list(iter_lines(io.BytesIO(data), limit=100))
    assert lines == [b"short\n", None, b"after\n"]
    record = parse_line(TXT, 2, None)
    assert record.error is not None and record.error.code == "text_too_long"
    assert line_limit("txt", 10) == 42


def test_records_bom_is_stripped_from_the_first_line_only() -> None:
    lines = list(iter_lines(io.BytesIO(b"\xef\xbb\xbfa\n\xef\xbb\xbfb\n"), limit=100))
    assert lines == [b"a\n", b"\xef\xbb\xbfb\n"]


def test_records_gzip_is_read_transparently(tmp_path: Path) -> None:
    path = tmp_path / "in.txt.gz"
    path.write_bytes(gzip.compress("一\n二\n三".encode()))
    with open_binary(source_for(str(path))) as stream:
        assert list(iter_lines(stream, 100)) == ["一\n".encode(), "二\n".encode(), "三".encode()]
    assert count_lines(source_for(str(path))) == 3


def test_records_gzip_stdin_is_detected_by_magic() -> None:
    stream = open_binary(Source("-", "txt"), io.BytesIO(gzip.compress(b"a\nb\n")))
    assert list(iter_lines(stream, 100)) == [b"a\n", b"b\n"]


def test_records_jsonl_error_messages_name_the_id_and_the_number() -> None:
    nested = parse_line(JSONL, 2, b'{"id": [[]], "text": "x"}', id_field="id")
    assert nested.error is not None and nested.error.message == (
        "line 2: id must be a string, a number, a boolean or null, got array"
    )
    huge = parse_line(JSONL, 3, b'{"id": -1e400, "text": "x"}')
    assert huge.error is not None and "the number -1e400 is out of range" in huge.error.message


def test_records_a_pipe_is_a_stream_and_is_never_sought(tmp_path: Path) -> None:
    """A pipe named as a path (``<(zcat a.gz)``) is read once, as stdin: its fingerprint reads
    nothing (it consumed the pipe), and gzip is peeked at, not sought."""
    read, write = os.pipe()
    os.write(write, gzip.compress(b"a\nb\n"))
    os.close(write)
    try:
        source = Source(f"/dev/fd/{read}", "txt")
        assert source.is_stream and fingerprint(source) == {"name": source.name}
        with open_binary(source) as stream:
            assert list(iter_lines(stream, 100)) == [b"a\n", b"b\n"]
    finally:
        os.close(read)
    regular = tmp_path / "a.txt"
    regular.write_text("x\n")
    assert not source_for(str(regular)).is_stream and source_for("-").is_stream


def test_records_a_bom_does_not_count_against_the_first_lines_limit() -> None:
    """The first read took the BOM's 3 bytes from the line's limit: a long first line was cut
    into two records, shifting every later id."""
    bom = b"\xef\xbb\xbf"
    fits = b"x" * 100 + b"\n"
    assert list(iter_lines(io.BytesIO(bom + fits + b"b\n"), limit=100)) == [fits, b"b\n"]
    over = b"x" * 200 + b"\n"
    assert list(iter_lines(io.BytesIO(bom + over + b"b\n"), limit=100)) == [None, b"b\n"]
    crlf = "字".encode() * 10 + b"\r\n"  # 10 characters, at line_limit("txt", 10)
    lines = list(iter_lines(io.BytesIO(bom + crlf + b"b\n"), limit=line_limit("txt", 10)))
    assert lines == [crlf, b"b\n"]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
@pytest.mark.parametrize("packed", [False, True])
def test_records_a_utf16_or_utf32_input_is_named_not_read_line_by_line(
    tmp_path: Path, encoding: str, packed: bool
) -> None:
    """``iconv -t utf-16`` output gave an error record per line (and one more for the NUL after the
    last newline), none of them saying UTF-16."""
    data = "\ufeff李白出生于碎叶城。\n杜甫是诗人。\n".encode(encoding)
    if encoding == "utf-16-be":
        assert data.startswith(b"\xfe\xff")
    path = tmp_path / ("in.txt.gz" if packed else "in.txt")
    path.write_bytes(gzip.compress(data) if packed else data)
    with pytest.raises(InputError, match=f"{path} is UTF-16 or UTF-32 .* iconv -f UTF-16"):
        open_binary(source_for(str(path)))
    with pytest.raises(InputError, match=r"stdin \(-\) is UTF-16 or UTF-32"):
        open_binary(Source("-", "txt"), io.BytesIO(data))
    plain = tmp_path / "plain.txt"
    plain.write_bytes("\ufeff李白\n".encode())  # a UTF-8 byte order mark is fine
    with open_binary(source_for(str(plain))) as stream:
        assert list(iter_lines(stream, 100)) == ["李白\n".encode()]


def test_records_a_byte_order_mark_alone_is_no_line(tmp_path: Path) -> None:
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf")
    with open_binary(source_for(str(path))) as stream:
        assert list(iter_lines(stream, 100)) == []
    assert count_lines(source_for(str(path))) == 0
    path.write_bytes(b"\xef\xbb\xbf\n")  # an empty line after it is a line, as without one
    assert count_lines(source_for(str(path))) == 1
    with open_binary(source_for(str(path))) as stream:
        assert list(iter_lines(stream, 100)) == [b"\n"]
