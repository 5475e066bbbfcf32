"""The output: whole JSON lines, written a window at a time, with a checkpoint for ``--resume``.

A file output (a regular file: a device or a pipe is refused, ``-o -`` is stdout) has a sidecar
``<output>.checkpoint.json`` while the run is in progress. After each window the lines are written
and fsynced, then the checkpoint (records done, output bytes, last id, errors, and the fingerprint
of inputs, options and model) is replaced atomically. ``--resume`` checks the checkpoint's fields
(counts; ``done`` lines up to its byte count, the last of them ``last_id``), then truncates the
output to the checkpointed byte count, so a partial line or a window written after the last
checkpoint (a kill between the two fsyncs) is cut and redone: no duplicate, no gap. The sidecar is removed when the run
completes; an output with no sidecar is complete (or not ours).

One writer at a time: before its model loads, a run claims the output (``claim``). It opens it
(creating it empty, with a first checkpoint, when it is new), takes an exclusive ``flock`` on it,
and only then decides whether it may write it as asked (an existing output needs ``--force``, or
``--resume`` and a checkpoint), so no other run can finish, start or resume it between the check
and the write. A run that finds the output held (a cron job that overlaps the last one, the same
command in a second shell) is refused at once. Two writers would each write at their own offsets
and interleave their records (with ``--force`` and other options: a file of both runs' lines). The
lock belongs to the open file, so a killed run leaves none behind. Nothing is truncated until
``open``, after the model has loaded: a run that stops before (its model fails to load, Ctrl-C)
leaves the output as it found it, and removes what its claim created. One that stops after ``open``
and before its first window (stdin found UTF-16 as it is read) still removes what its claim created: a
new output leaves nothing behind; an existing one that ``--force`` was to replace is empty by then.

The checkpoint's name is the output's plus ``.checkpoint.json`` (and ``.tmp`` while it is
replaced): an output whose name leaves no room for that within the file system's limit is refused
up front.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from app.core.jsonlines import LINE_BREAKS
from nlp.values import Failure, Outcome

CHECKPOINT_SUFFIX = ".checkpoint.json"
TMP_SUFFIX = ".tmp"  # the checkpoint is written under its name plus this, then renamed over it
CHECKPOINT_VERSION = 1
NAME_MAX = 255  # bytes in one file name, where the file system does not say (Linux's and macOS's)


class OutputError(Exception):
    """The output cannot be written or resumed as asked; the message says why and what to do."""


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON on one line for any reader (``str.splitlines()`` included); a lone
    surrogate (only possible in an id) falls back to ASCII escapes. Every JSON-lines file spo writes
    from a user's text is written with it (this output, ``spo evaluate --errors``)."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        return text.translate(LINE_BREAKS).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode("ascii")


def encode_outcome(outcome: Outcome) -> bytes:
    """An output line's body: the members of ``outcome.to_dict()`` without braces
    (``"entities":[...],...`` or ``"error":{...}``)."""
    return json_bytes(outcome.to_dict())[1:-1]


def is_error(outcome: Outcome) -> bool:
    return isinstance(outcome, Failure)


def dumps_line(record_id: Any, outcome: Outcome) -> bytes:
    """One output line: ``{"id":...,<outcome>}`` and a newline; the outcome is encoded here, at the
    edge (``encode_outcome``)."""
    return b'{"id":' + json_bytes(record_id) + b"," + encode_outcome(outcome) + b"}\n"


@dataclass
class Checkpoint:
    fingerprint: dict[str, Any]
    done: int = 0  # selected input records written
    bytes: int = 0  # output size after them
    errors: int = 0  # error records among them
    last_id: Any = None
    version: int = field(default=CHECKPOINT_VERSION)

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + TMP_SUFFIX)
        try:
            with tmp.open("w", encoding="utf-8") as fh:
                json.dump(asdict(self), fh, ensure_ascii=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except (
            BaseException
        ):  # a full disk, an interrupt: the saved checkpoint stays, no stray file
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        """The checkpoint in ``path``, its fields checked (a changed one would resume at the wrong
        place, writing records twice or not at all): ``OutputError`` for anything else."""
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(doc, dict):
                raise ValueError(f"a JSON {type(doc).__name__}, not an object")
            if doc.get("version") != CHECKPOINT_VERSION:
                raise ValueError(f"version {doc.get('version')!r}")
            saved = cls(**doc)
            counts = {"done": saved.done, "bytes": saved.bytes, "errors": saved.errors}
            for name, value in counts.items():
                if type(value) is not int or value < 0:
                    raise ValueError(f"{name} is {value!r}, not a count")
            if not isinstance(saved.fingerprint, dict):
                raise ValueError("its fingerprint is not an object")
            if saved.errors > saved.done or (saved.done == 0) != (saved.bytes == 0):
                raise ValueError(f"done {saved.done}, errors {saved.errors}, bytes {saved.bytes}")
            return saved
        except (OSError, ValueError, TypeError) as exc:
            raise OutputError(
                f"{path}: unreadable checkpoint ({exc}); use --force to start over"
            ) from exc


def checkpoint_path(output: Path) -> Path:
    """The checkpoint sidecar of the file ``output``: ``<output>.checkpoint.json`` beside it."""
    return output.with_name(output.name + CHECKPOINT_SUFFIX)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def diff_fingerprints(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable differences (``key: old -> new``), empty when they match."""
    out = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            out.append(f"{key}: {json.dumps(old.get(key))} -> {json.dumps(new.get(key))}")
    return out


class Output:
    """Where output lines go; ``checkpoint`` is the state to resume from (``done == 0``: fresh)."""

    def __init__(self, name: str, fingerprint: dict[str, Any]) -> None:
        self.name = name
        self.checkpoint = Checkpoint(fingerprint)

    def claim(self) -> None:
        """Make sure this run may write the output, before the model loads (see the module doc)."""

    def open(self) -> None: ...

    def write_window(self, data: bytes, records: int, errors: int, last_id: Any) -> None:
        raise NotImplementedError

    def finish(self) -> None: ...

    def abort(self) -> None: ...


class StreamOutput(Output):
    """stdout (or any binary stream): flushed a window at a time; cannot be resumed."""

    def __init__(self, stream: BinaryIO | None, fingerprint: dict[str, Any]) -> None:
        super().__init__("-", fingerprint)
        self.stream = stream if stream is not None else sys.stdout.buffer

    def write_window(self, data: bytes, records: int, errors: int, last_id: Any) -> None:
        self.stream.write(data)
        self.stream.flush()
        self.checkpoint.done += records
        self.checkpoint.errors += errors
        self.checkpoint.last_id = last_id

    def finish(self) -> None:
        self.stream.flush()


class FileOutput(Output):
    """A file with a checkpoint sidecar; see the module docstring for the protocol."""

    def __init__(
        self, path: Path, fingerprint: dict[str, Any], *, resume: bool, force: bool
    ) -> None:
        super().__init__(str(path), fingerprint)
        self.path = path
        self.sidecar = checkpoint_path(path)
        self.resume, self.force = resume, force
        self.fd: int | None = None
        self.resuming = False
        self._made: list[Path] = []  # what claim() created, removed if the run stops before open()
        if resume and force:
            raise OutputError("--resume and --force exclude each other")
        _check_name_length(path, self.sidecar)
        if path.is_dir():
            raise OutputError(f"{path} is a directory")
        if path.exists() and not path.is_file():
            # A device or a pipe can be neither fsynced, truncated for --resume, nor given a sidecar.
            raise OutputError(
                f"{path} is not a regular file: -o takes a file; -o - writes to stdout (redirect "
                "or pipe that)"
            )
        base = next(parent for parent in path.parents if parent.exists())  # at worst . or /
        if not base.is_dir():
            raise OutputError(f"cannot write {path}: {base} is a file, not a directory")

    def claim(self) -> None:
        """Lock the output (created empty, with a first checkpoint, if it is new), then check under
        the lock that this run may write it as asked; refused, it is left as it was found."""
        if self.fd is not None:
            return
        try:
            self._claim()
        except OSError as exc:  # a read-only mount, no permission, a file where a directory goes
            self.abort()
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        except BaseException:
            self.abort()
            raise

    def _claim(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd, created = _lock(self.path)
        if created:
            self._made.append(self.path)
        has_sidecar = self.sidecar.exists()
        self._check_allowed(existed=not created, has_sidecar=has_sidecar)
        if created and not has_sidecar:
            # A run killed while its model loads leaves an output that --resume continues (and
            # that says so), not an empty file that looks complete.
            self._made.append(self.sidecar)
            self.checkpoint.save(self.sidecar)

    def _check_allowed(self, *, existed: bool, has_sidecar: bool) -> None:
        """An output that exists needs ``--force`` (or ``--resume``, when it has a checkpoint)."""
        if self.resume and has_sidecar:
            self._check_resumable(Checkpoint.load(self.sidecar), existed=existed)
        elif self.resume and existed:
            raise OutputError(
                f"{self.path} exists and has no checkpoint ({self.sidecar.name}): it is complete "
                "or was not written by spo extract; nothing to resume (use --force to overwrite it)"
            )
        elif existed and not self.force:
            hint = (
                "an interrupted run: add --resume to continue it, or --force to start over"
                if has_sidecar
                else "add --force to overwrite it"
            )
            raise OutputError(f"{self.path} already exists ({hint})")
        elif has_sidecar and not self.force:
            # The output was removed (or moved) after an interrupted run; its checkpoint stayed.
            raise OutputError(
                f"{self.path} is missing but its checkpoint {self.sidecar.name} is there (an "
                "interrupted run whose output was removed): add --force to start over"
            )

    def _check_resumable(self, saved: Checkpoint, *, existed: bool) -> None:
        changes = diff_fingerprints(saved.fingerprint, self.checkpoint.fingerprint)
        if changes:
            raise OutputError(
                f"cannot resume {self.path}: the inputs, options or model differ from the interrupted "
                "run:\n  " + "\n  ".join(changes) + "\n(use --force to start over)"
            )
        if not existed:
            if saved.bytes:
                raise OutputError(f"cannot resume: {self.path} is missing (use --force)")
        elif self.path.stat().st_size < saved.bytes:
            raise OutputError(
                f"cannot resume: {self.path} is shorter ({self.path.stat().st_size} bytes) than its "
                f"checkpoint ({saved.bytes} bytes); it was changed (use --force to start over)"
            )
        if saved.bytes:
            last = _line_before(self.path, saved.bytes)
            try:
                last_id = json.loads(last)["id"]
            except (ValueError, KeyError, TypeError):
                last_id = object()
            if last_id != saved.last_id:
                raise OutputError(
                    f"cannot resume: the last checkpointed line of {self.path} is not the record "
                    f"{json.dumps(saved.last_id)}; the file was changed (use --force to start over)"
                )
            # One line per record: a count that disagrees would skip or repeat input records.
            lines = _lines_in(self.path, saved.bytes)
            if lines != saved.done:
                raise OutputError(
                    f"cannot resume: {self.path} holds {lines} records up to its checkpoint, which "
                    f"counts {saved.done}; one of them was changed (use --force to start over)"
                )
        self.checkpoint = saved
        self.resuming = True

    def open(self) -> None:
        """Truncate the claimed output (to its checkpoint when resuming); checkpoint it."""
        self.claim()
        try:
            self._open()
        except OSError as exc:  # a read-only mount, no permission, a full disk
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def _open(self) -> None:
        fd = self.fd
        assert fd is not None, "claim() first"
        if self.resuming:
            os.ftruncate(fd, self.checkpoint.bytes)
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_END)
        else:
            self.checkpoint.save(self.sidecar)
            os.ftruncate(fd, 0)
            os.fsync(fd)
            _fsync_dir(self.path.parent)
        # What claim() created stays removable until the first window is written (then it is kept
        # for --resume whatever happens next): a run that stops before (an input found unreadable
        # as it is read, Ctrl-C) leaves nothing to resume, and nothing behind.

    def write_window(self, data: bytes, records: int, errors: int, last_id: Any) -> None:
        try:
            self._write_window(data, records, errors, last_id)
        except OSError as exc:  # a full disk, a quota: what the last checkpoint counts is whole
            raise OutputError(
                f"cannot write {self.path}: {exc.strerror or exc}; the output up to the last "
                "checkpoint is whole: make room, then run the same command with --resume"
            ) from None

    def _write_window(self, data: bytes, records: int, errors: int, last_id: Any) -> None:
        assert self.fd is not None, "open() first"
        # From the first window on, what claim() created is the run's to --resume, whatever
        # happens next (a full disk, Ctrl-C between the data and its checkpoint).
        self._made.clear()
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        os.fsync(self.fd)
        cp = self.checkpoint
        cp.done += records
        cp.bytes += len(data)
        cp.errors += errors
        cp.last_id = last_id
        cp.save(self.sidecar)

    def finish(self) -> None:
        """The run is complete: drop the checkpoint, then close the file (and so unlock it)."""
        self.sidecar.unlink(missing_ok=True)
        _fsync_dir(self.path.parent)
        self._made.clear()  # complete, if empty (an input of no record): kept
        self.abort()

    def abort(self) -> None:
        """Close (and so unlock), keeping the checkpoint: ``--resume`` continues from the last whole
        window. Before the first window, what ``claim`` created is removed first, under the lock."""
        if self.fd is None:
            return
        for made in reversed(self._made):
            with contextlib.suppress(OSError):
                made.unlink(missing_ok=True)
        self._made.clear()
        os.close(self.fd)
        self.fd = None


def _lock(path: Path) -> tuple[int, bool]:
    """``(fd, created)``: ``path`` opened for writing (created empty if missing, never truncated)
    under an exclusive ``flock``, taken without waiting: a run that holds it is ``_busy``."""
    while True:
        try:
            fd, created = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            try:
                fd, created = os.open(path, os.O_WRONLY), False
            except FileNotFoundError:
                if path.is_symlink():  # O_EXCL never follows a link: it would loop here for good
                    raise OutputError(
                        f"{path} is a symbolic link to {os.readlink(path)}, which does not exist: "
                        "create that file, or name the output itself"
                    ) from None
                continue  # removed in between (a run that gave up before writing): create it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(path) from None
        if _is_at(fd, path):
            return fd, created
        os.close(fd)  # locked a file that its run removed meanwhile: lock the one there now


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the one named ``path``."""
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _check_name_length(path: Path, sidecar: Path) -> None:
    """Refuse an output whose checkpoint would have a name longer than the file system allows
    (``<output>.checkpoint.json.tmp``: an ``OSError`` after the model has loaded, otherwise)."""
    longest = len(os.fsencode(sidecar.name + TMP_SUFFIX))
    limit = _name_max(path)
    if longest > limit:
        raise OutputError(
            f"{path}: the output's name is too long: its checkpoint sidecar's name "
            f"({CHECKPOINT_SUFFIX}{TMP_SUFFIX} added) would be {longest} bytes, over the file "
            f"system's limit of {limit}; use a name of at most "
            f"{limit - len(CHECKPOINT_SUFFIX + TMP_SUFFIX)} bytes"
        )


def _name_max(path: Path) -> int:
    """The longest file name, in bytes, that the file system of ``path`` takes."""
    for parent in path.parents:
        try:
            return os.pathconf(parent, "PC_NAME_MAX")
        except FileNotFoundError:
            continue  # a directory the run will make: ask the first that exists
        except (OSError, ValueError):
            break
    return NAME_MAX


def _busy(path: Path) -> OutputError:
    return OutputError(
        f"{path} is being written by another spo extract run right now; wait for it to end (or "
        "stop it: its output can be resumed with --resume)"
    )


def _lines_in(path: Path, size: int) -> int:
    """Newlines in the first ``size`` bytes of ``path``, read a MiB at a time."""
    count = 0
    with path.open("rb") as fh:
        while size > 0:
            block = fh.read(min(size, 1 << 20))
            if not block:
                break
            count += block.count(b"\n")
            size -= len(block)
    return count


def _line_before(path: Path, offset: int) -> bytes:
    """The newline-terminated line that ends at byte ``offset``."""
    with path.open("rb") as fh:
        start = offset
        while start > 0:
            step = min(start, 1 << 16)
            fh.seek(start - step)
            block = fh.read(step)
            cut = block.rfind(b"\n", 0, len(block) - (1 if start == offset else 0))
            if cut >= 0:
                start = start - step + cut + 1
                break
            start -= step
        fh.seek(start)
        return fh.read(offset - start)
