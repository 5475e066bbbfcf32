"""``run_batch`` and ``spo extract`` with a fake extractor: order, ids, error records, workers,
shards, output refusals, stdin/stdout. The real model runs in ``test_batch_model.py``."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import io
import json
import os
import random
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from app.batch import BatchOptions, BatchSummary, run_batch
from app.batch.output import OutputError
from app.batch.records import InputError
from app.batch.runner import BatchError
from app.cli import main
from tests.app.test_batch_fakes import BOOM, HANG, SLOW, FakeFactory

FAKE = FakeFactory()


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def mixed_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    pieces = ["北京", "张三", "在", "，", "😀", "e\u0301", "\u3000", "abc", "。"]
    return ["".join(rng.choices(pieces, k=rng.randint(0, 40))) for _ in range(n)]


def batch_options(
    tmp_path: Path, inputs: list[Path], name: str = "out.jsonl", **options: Any
) -> BatchOptions:
    """Options of a run over ``inputs`` into ``tmp_path / name`` (no worker processes unless
    ``options`` say so)."""
    return BatchOptions(
        inputs=tuple(str(p) for p in inputs),
        output=str(tmp_path / name),
        model_dir=tmp_path,
        **{"workers": 0, **options},
    )


def run(tmp_path: Path, inputs: list[Path], name: str = "out.jsonl", **options: Any) -> Path:
    factory = options.pop("factory", FAKE)
    run_batch(batch_options(tmp_path, inputs, name, **options), factory=factory)
    return tmp_path / name


def check_offsets(texts: dict[Any, str], records: list[dict[str, Any]]) -> None:
    for rec in records:
        for entity in rec.get("entities", []):
            assert texts[rec["id"]][entity["start"] : entity["end"]] == entity["text"]


def test_batch_a_utf16_input_leaves_no_output_to_resume(tmp_path: Path) -> None:
    """A UTF-16 file was found unreadable after the model loaded and the output opened: it left an
    empty output and a checkpoint of nothing, and the same command (the input converted) then
    needed --force. A file is refused before the model loads; stdin, found as it is read, takes
    back what its run made."""
    wide = tmp_path / "in.txt"
    wide.write_bytes("\ufeff李白出生于碎叶城。\n".encode("utf-16"))
    loads: list[Any] = []

    def factory(options: Any) -> Any:
        loads.append(options)
        return FAKE(options)

    with pytest.raises(InputError, match="is UTF-16 or UTF-32"):
        run(tmp_path, [wide], factory=factory)
    assert loads == [] and not (tmp_path / "out.jsonl").exists()
    with pytest.raises(InputError, match=r"stdin \(-\) is UTF-16 or UTF-32"):
        run_batch(
            BatchOptions(
                inputs=("-",), output=str(tmp_path / "out.jsonl"), model_dir=tmp_path, workers=0
            ),
            factory=FAKE,
            stdin=io.BytesIO(wide.read_bytes()),
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
    wide.write_text("李白出生于碎叶城。\n", encoding="utf-8")  # converted: the same command runs
    assert len(lines(run(tmp_path, [wide]))) == 1
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")  # no record, no window: a complete, empty output all the same
    assert run(tmp_path, [empty], name="none.jsonl").read_bytes() == b""
    assert not (tmp_path / "none.jsonl.checkpoint.json").exists()


def test_batch_txt_order_ids_and_offsets_across_windows(tmp_path: Path) -> None:
    texts = mixed_texts(500)
    path = tmp_path / "in.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    records = lines(run(tmp_path, [path], window=37, chunk_size=8))
    assert [r["id"] for r in records] == list(range(1, 501))
    assert all("error" not in r for r in records)
    check_offsets(dict(enumerate(texts, 1)), records)
    assert sum(len(r["entities"]) for r in records) > 100


def test_batch_jsonl_mixed_valid_invalid_and_extreme_records(tmp_path: Path) -> None:
    rows = [
        '{"id": "ok", "text": "张三在北京"}',
        "not json",
        '{"id": "no-text"}',
        '{"id": "num", "text": 5}',
        '{"id": "long", "text": "' + "北" * 101 + '"}',
        '{"id": "surrogate", "text": "\\ud800北京"}',
        '{"id": "bug", "text": "trips the bug"}',
        "",
        '{"id": "empty", "text": ""}',
        '{"id": "\\udfff", "text": "北京"}',
        '{"text": "no id: the line number"}',
        '{"id": "last", "text": "北京\\n张三"}',
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(rows), encoding="utf-8")  # no final newline
    out = run(tmp_path, [path], max_text_chars=100, window=4, factory=FakeFactory(raise_on="trips"))
    records = lines(out)
    assert len(records) == len(rows)
    codes = [(r["id"], r.get("error", {}).get("code")) for r in records]
    assert codes == [
        ("ok", None),
        (2, "invalid_json"),
        ("no-text", "invalid_input"),
        ("num", "invalid_input"),
        ("long", "text_too_long"),
        ("surrogate", "invalid_input"),
        ("bug", "internal_error"),
        (8, "invalid_json"),
        ("empty", None),
        ("\udfff", None),
        (11, None),
        ("last", None),
    ]
    assert records[-1]["entities"] == [
        {"text": "北京", "start": 0, "end": 2, "type": "地点"},
        {"text": "张三", "start": 3, "end": 5, "type": "人物"},
    ]
    assert "\\udfff" in out.read_text(encoding="utf-8")  # the output stays valid UTF-8


def test_batch_several_inputs_prefix_ids_with_the_input(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.jsonl.gz"
    a.write_text("北京\n上海\n", encoding="utf-8")
    b.write_bytes(gzip.compress('{"id": 7, "text": "张三"}\n'.encode()))
    ids = [r["id"] for r in lines(run(tmp_path, [a, b]))]
    assert ids == [f"{a}:1", f"{a}:2", f"{b}:7"]


def test_batch_workers_0_1_2_give_identical_output(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_text("\n".join(mixed_texts(300, seed=1)), encoding="utf-8")
    outs = [
        run(tmp_path, [path], name=f"w{w}.jsonl", workers=w, window=50, chunk_size=8).read_bytes()
        for w in (0, 1, 2)
    ]
    assert outs[0] == outs[1] == outs[2]


def run_recycling(tmp_path: Path, texts: list[str], **options: Any) -> BatchSummary:
    """A run over ``texts`` with ``options`` (worker processes that get replaced), checked to
    write exactly what one in-process run with the same window and chunks writes."""
    path = tmp_path / "in.txt"
    path.write_text("\n".join(texts), encoding="utf-8")
    shape = {"window": options["window"], "chunk_size": options["chunk_size"]}
    ref = run(tmp_path, [path], name="ref.jsonl", **shape).read_bytes()
    summary = run_batch(batch_options(tmp_path, [path], "r.jsonl", **options), factory=FAKE)
    assert (tmp_path / "r.jsonl").read_bytes() == ref
    return summary


def test_batch_recycled_workers_lose_and_reorder_nothing(tmp_path: Path) -> None:
    texts = mixed_texts(200, seed=2)
    summary = run_recycling(tmp_path, texts, workers=2, recycle_after=40, window=30, chunk_size=8)
    assert summary.recycled >= 3


def test_batch_worker_death_retries_its_chunk_once(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    texts = mixed_texts(60, seed=3)
    texts[30] = "北京" + BOOM
    path.write_text("\n".join(texts), encoding="utf-8")
    ref = run(tmp_path, [path], name="ref.jsonl", window=20, chunk_size=8).read_bytes()
    factory = FakeFactory(die_once=str(tmp_path / "died"))
    opts = batch_options(tmp_path, [path], "o.jsonl", workers=1, window=20, chunk_size=8)
    summary = run_batch(opts, factory=factory)
    assert summary.restarted == 1
    assert (tmp_path / "o.jsonl").read_bytes() == ref

    # A text that kills every worker that runs it (a poison record) stopped the run, and every
    # --resume of it: now its chunk is split, the text found, and it alone is an error record.
    summary = run_batch(
        opts.__class__(**{**opts.__dict__, "force": True}), factory=FakeFactory(die_always=True)
    )
    got, want = lines(tmp_path / "o.jsonl"), lines(tmp_path / "ref.jsonl")
    assert [r["id"] for r in got] == [r["id"] for r in want]
    assert [g for g, w in zip(got, want, strict=True) if g != w] == [got[30]]
    assert got[30]["error"]["code"] == "internal_error"
    assert "died twice running this record alone (exit code 3)" in got[30]["error"]["message"]
    assert summary.errors == sum("error" in r for r in want) + 1
    assert summary.restarted == 4  # the chunk twice, then the text alone twice
    assert not (tmp_path / "o.jsonl.checkpoint.json").exists()


def test_batch_shards_partition_the_input(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_text("\n".join(mixed_texts(100, seed=4)), encoding="utf-8")
    full = {r["id"]: r for r in lines(run(tmp_path, [path], name="all.jsonl"))}
    seen: list[int] = []
    for k in (1, 2, 3):
        shard = lines(run(tmp_path, [path], name=f"s{k}.jsonl", shard=(k, 3)))
        assert [r["id"] for r in shard] == list(range(k, 101, 3))
        assert all(full[r["id"]] == r for r in shard)
        seen += [r["id"] for r in shard]
    assert sorted(seen) == list(range(1, 101))


def test_batch_existing_output_is_refused_without_force(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_text("北京\n", encoding="utf-8")
    out = run(tmp_path, [path])
    with pytest.raises(OutputError, match=r"already exists.*--force"):
        run(tmp_path, [path])
    with pytest.raises(OutputError, match="no checkpoint"):
        run(tmp_path, [path], resume=True)
    out.write_text("old\n")
    run(tmp_path, [path], force=True)
    assert lines(out)[0]["id"] == 1


def test_batch_output_cannot_be_an_input(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "x"}\n')
    with pytest.raises(Exception, match="also an input"):
        run(tmp_path, [path], name="in.jsonl", force=True)
    assert path.read_text() == '{"text": "x"}\n'


def test_batch_output_must_be_a_regular_file(tmp_path: Path) -> None:
    """A device or a pipe cannot be fsynced, truncated for --resume, or given a sidecar beside it
    (/dev/null.checkpoint.json): refused up front, even with --force."""
    path = tmp_path / "in.txt"
    path.write_text("x\n")
    os.mkfifo(tmp_path / "pipe")
    for target in (tmp_path / "pipe", Path(os.devnull)):
        with pytest.raises(OutputError, match="is not a regular file: -o takes a file; -o - "):
            run_batch(
                BatchOptions(inputs=(str(path),), output=str(target), force=True),
                factory=FakeFactory(),
            )
    assert not Path(os.devnull + ".checkpoint.json").exists()
    assert not (tmp_path / "pipe.checkpoint.json").exists()


def test_batch_output_that_cannot_be_written_is_one_line_and_a_full_disk_is_resumable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "in.txt"
    path.write_text("".join(f"北京{i}\n" for i in range(40)), encoding="utf-8")
    (tmp_path / "blocker").write_text("")
    with pytest.raises(
        OutputError,
        match=r"^cannot write .*blocker/out.jsonl: .*blocker is a file, not a directory$",
    ):
        run(tmp_path, [path], name="blocker/out.jsonl")
    from app.batch import output

    def read_only(*args: Any) -> int:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(output.os, "open", read_only)  # a read-only mount (root ignores chmod)
    with pytest.raises(OutputError, match=r"^cannot write .*out.jsonl: Read-only file system$"):
        run(tmp_path, [path])
    monkeypatch.undo()
    # The disk fills after the first window: the message says what is whole and how to go on.

    real_write, calls = os.write, []

    def full_after_one(fd: int, data: Any) -> int:
        calls.append(fd)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(output.os, "write", full_after_one)
    with pytest.raises(OutputError, match="No space left on device; the output up to the last "):
        run(tmp_path, [path], window=8, force=True)
    monkeypatch.undo()
    out = run(tmp_path, [path], window=8, resume=True)
    assert [r["id"] for r in lines(out)] == list(range(1, 41))


@pytest.fixture
def fake_cli(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    import app.batch.command as command

    monkeypatch.setattr(command, "run_batch", functools.partial(run_batch, factory=FAKE))
    return CliRunner()


def test_batch_cli_stdin_to_stdout(fake_cli: CliRunner) -> None:
    result = fake_cli.invoke(main, ["extract", "-", "--workers", "0"], input="张三在北京\n\n")
    assert result.exit_code == 0, result.output
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in out] == [1, 2]
    assert [e["text"] for e in out[0]["entities"]] == ["张三", "北京"]
    assert "2 records, 0 errors" in result.stderr


def test_batch_cli_strict_exits_non_zero_on_error_records(fake_cli: CliRunner) -> None:
    args = ["extract", "-", "--workers", "0", "--format", "jsonl"]
    loose = fake_cli.invoke(main, args, input='{"text": "x"}\nbad\n')
    assert loose.exit_code == 0 and "1 errors" in loose.stderr
    strict = fake_cli.invoke(main, [*args, "--strict"], input='{"text": "x"}\nbad\n')
    assert strict.exit_code == 1 and "--strict" in strict.stderr
    assert len(strict.stdout.splitlines()) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shard", "4/3"], "1 <= K <= N"),
        (["--shard", "x"], "K/N"),
        (["--resume"], "needs an output file"),
        (["-o", "out.jsonl", "--resume", "--force"], "--resume and --force exclude each other"),
        (["-", "-"], "only once"),
        # No worker process to replace: the limits were silently ignored.
        (["--workers", "0", "--recycle-after", "1"], "--recycle-after replaces worker processes"),
        (["--workers", "0", "--max-worker-rss", "1"], "--max-worker-rss replaces worker processes"),
    ],
)
def test_batch_cli_rejects_bad_options(fake_cli: CliRunner, args: list[str], message: str) -> None:
    result = fake_cli.invoke(main, ["extract", "-", *args], input="x\n")
    assert result.exit_code == 2 and message in result.stderr


def test_batch_cli_field_names_keep_their_spaces(fake_cli: CliRunner) -> None:
    """``--text-field ' body'`` was stripped to ``body``: every record "missing field 'body'"."""
    args = ["extract", "-", "--workers", "0", "--input-format", "jsonl"]
    result = fake_cli.invoke(
        main,
        [*args, "--text-field", " body", "--id-field", "k "],
        input='{" body": "x", "k ": 7}\n',
    )
    assert result.exit_code == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert '"id":7' in line and "error" not in line
    blank = fake_cli.invoke(main, [*args, "--text-field", "  "], input="{}\n")
    assert blank.exit_code == 2 and "expected a value, got nothing" in blank.stderr


def test_batch_cli_metrics_file_never_replaces_an_input_or_the_output(
    fake_cli: CliRunner, tmp_path: Path
) -> None:
    (tmp_path / "a.txt").write_text("x\n")
    out = tmp_path / "out.jsonl"
    for metrics, what in ((tmp_path / "a.txt", "an input"), (out, "the output")):
        args = ["extract", str(tmp_path / "a.txt"), "-o", str(out), "--metrics-file", str(metrics)]
        result = fake_cli.invoke(main, args)
        assert result.exit_code == 2 and f"is {what}: the metrics would replace it" in result.stderr
    assert (tmp_path / "a.txt").read_text() == "x\n" and not out.exists()
    args = ["extract", str(tmp_path / "a.txt"), "-o", str(out), "--metrics-file"]
    assert fake_cli.invoke(main, [*args, str(tmp_path / "spo.prom")]).exit_code == 0
    assert "spo_batch_records 1" in (tmp_path / "spo.prom").read_text()
    # A place it cannot be written is named before the run (was: an error after the whole run).
    out.unlink()
    result = fake_cli.invoke(main, [*args, str(tmp_path / "a.txt" / "spo.prom")])
    assert result.exit_code == 2 and "cannot write" in result.stderr and not out.exists()
    # A directory that does not exist yet is made, as -o makes its own.
    result = fake_cli.invoke(main, [*args, str(tmp_path / "new" / "spo.prom"), "--force"])
    assert result.exit_code == 0 and (tmp_path / "new" / "spo.prom").is_file()
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["spo.prom"]


def test_batch_cli_metrics_file_refuses_what_it_would_replace_or_fail_on_after_the_run(
    fake_cli: CliRunner, tmp_path: Path
) -> None:
    """A FIFO or a device (as root: /dev/null itself) was replaced by a regular file; a name the
    file system takes but its temporary name (".pid.thread" added) not, or an empty one, failed
    only after the whole run."""
    (tmp_path / "a.txt").write_text("x\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    args = ["extract", str(tmp_path / "a.txt"), "-o", str(tmp_path / "o.jsonl"), "--metrics-file"]
    for target, message in (
        (str(fifo), "fifo is not a regular file"),
        ("/dev/null", "/dev/null is not a regular file"),
        ("", "is not a file name"),
        (str(tmp_path / ("m" * 300)), "cannot write"),
    ):
        result = fake_cli.invoke(main, [*args, target])
        assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode) and not (tmp_path / "o.jsonl").exists()
    longest = tmp_path / ("m" * 250 + ".prom")  # 255 bytes: the file system takes it
    assert fake_cli.invoke(main, [*args, str(longest)]).exit_code == 0
    assert "spo_batch_records 1" in longest.read_text()
    assert oct(longest.stat().st_mode & 0o777) == "0o644"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".spo-metrics-")]


def test_batch_cli_interrupted_says_how_to_resume(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import app.batch.command as command

    def interrupted(*args: Any, **kwargs: Any) -> BatchSummary:
        (tmp_path / "o.checkpoint.json").write_text("{}")  # stopped after its first checkpoint
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "run_batch", interrupted)
    (tmp_path / "a.txt").write_text("x\n")
    to_file = CliRunner().invoke(
        main, ["extract", str(tmp_path / "a.txt"), "-o", str(tmp_path / "o")]
    )
    assert to_file.exit_code == 130 and "add --resume to the same command" in to_file.stderr
    forced = CliRunner().invoke(
        main, ["extract", str(tmp_path / "a.txt"), "-o", str(tmp_path / "o"), "--force"]
    )
    assert forced.exit_code == 130 and "with --resume instead of --force" in forced.stderr
    to_stdout = CliRunner().invoke(main, ["extract", str(tmp_path / "a.txt")])
    assert to_stdout.exit_code == 130 and "use -o FILE to be able to --resume" in to_stdout.stderr


def test_batch_cli_runs_from_a_thread_other_than_the_main_one(
    fake_cli: CliRunner, tmp_path: Path
) -> None:
    """SIGTERM's handler is set from the main thread only (elsewhere Python refuses to set one)."""
    import threading

    (tmp_path / "a.txt").write_text("张三在北京\n")
    results: list[Any] = []
    args = ["extract", str(tmp_path / "a.txt"), "-o", str(tmp_path / "o.jsonl")]
    thread = threading.Thread(target=lambda: results.append(fake_cli.invoke(main, args)))
    thread.start()
    thread.join(60)
    assert results and results[0].exit_code == 0, results and results[0].output
    assert len(lines(tmp_path / "o.jsonl")) == 1


def test_batch_cli_refuses_one_file_given_twice(fake_cli: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x\n")
    (tmp_path / "b.txt").write_text("x\n")
    twice = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), f"{tmp_path}/./a.txt"]
    result = fake_cli.invoke(main, ["extract", *twice])
    assert result.exit_code == 2
    assert f"the input {tmp_path}/./a.txt is {tmp_path / 'a.txt'} again" in result.stderr
    assert fake_cli.invoke(main, ["extract", *twice[:2]]).exit_code == 0


def test_batch_cli_help_documents_ids() -> None:
    result = CliRunner().invoke(main, ["extract", "--help"])
    assert "line number (1-based)" in result.stdout and "--resume" in result.stdout


def test_batch_memory_is_bounded_by_the_window_not_the_input(tmp_path: Path) -> None:
    """Ten times the input, the same peak of traced memory. Traced in a fresh interpreter: in the
    test process, what earlier tests left (their threads, their garbage's finalizers) allocated
    inside the traced run (8.5 MB after the whole fast suite on Python 3.13, 1.05 MB alone)."""
    import subprocess
    import sys
    import textwrap

    from tests import PROJECT_ROOT

    script = textwrap.dedent(
        f"""
        import json, tracemalloc
        from pathlib import Path
        from tests.app.test_batch import run
        tmp, peaks = Path({str(tmp_path)!r}), []
        for n in (2_000, 20_000):
            path = tmp / f"in{{n}}.txt"
            path.write_text("".join(f"张三在北京{{i}}" + "文" * (i % 50) + "\\n" for i in range(n)))
            tracemalloc.start()
            run(tmp, [path], name=f"o{{n}}.jsonl", window=500)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        print(json.dumps(peaks))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    peaks = json.loads(done.stdout.splitlines()[-1])
    for n in (2_000, 20_000):
        assert len((tmp_path / f"o{n}.jsonl").read_text().splitlines()) == n
    # Ten times the input (about 1.5 MB of output at 20k): the same peak, well under one output.
    assert peaks[1] < peaks[0] * 1.2
    assert peaks[1] < (tmp_path / "o20000.jsonl").stat().st_size / 2


def test_batch_progress_bar_counts_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "in.txt"
    path.write_text("北京\n" * 50)
    run_batch(batch_options(tmp_path, [path], "o.jsonl"), factory=FAKE, progress=True)
    err = capsys.readouterr().err
    assert "50/50" in err and "rec/s" in err


def test_batch_init_app_registers_the_flask_command(tmp_path: Path) -> None:
    from flask import Flask

    import app.batch.command as command
    from app.batch import init_app

    flask_app = Flask(__name__)
    init_app(flask_app)
    assert flask_app.cli.get_command(None, "extract") is command.extract  # type: ignore[arg-type]
    result = flask_app.test_cli_runner().invoke(args=["extract", "--help"])
    assert result.exit_code == 0 and "--resume" in result.output


def test_batch_worker_over_the_rss_limit_is_replaced_between_chunks(tmp_path: Path) -> None:
    texts = mixed_texts(40, seed=6)
    summary = run_recycling(tmp_path, texts, workers=1, max_rss_mb=1, window=20, chunk_size=8)
    assert summary.recycled == 6  # after each of the 2 x 3 chunks: any process is over 1 MiB


def test_batch_unicode_line_breaks_inside_texts_stay_in_one_line(tmp_path: Path) -> None:
    texts = ["北京\u2028张三", "a\x85北京", "\u2029", "\x0b\x0c\x1c北京"]
    path = tmp_path / "in.txt"
    path.write_bytes("\n".join(texts).encode())  # .txt records end at \n only
    out = run(tmp_path, [path])
    records = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in records] == [1, 2, 3, 4]
    check_offsets(dict(enumerate(texts, 1)), records)
    assert [len(r["entities"]) for r in records] == [2, 1, 0, 1]


# -- --record-timeout (issue 12) ------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 1])
def test_batch_record_timeout_turns_a_runaway_record_into_an_error_record(
    tmp_path: Path, workers: int
) -> None:
    path = tmp_path / "in.txt"
    texts = ["张三在北京"] * 6
    texts[2] = "北京" + SLOW
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    started = time.monotonic()
    records = lines(
        run(
            tmp_path,
            [path],
            workers=workers,
            chunk_size=4,
            record_timeout=0.3,
            factory=FakeFactory(slow_s=3.0),
        )
    )
    assert time.monotonic() - started < 30
    assert [r["id"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[2]["error"]["code"] == "deadline_exceeded"
    assert "--record-timeout 0.3s" in records[2]["error"]["message"]
    assert all("entities" in r for i, r in enumerate(records) if i != 2)


def test_batch_record_timeout_kills_a_hung_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.batch import workers as batch_workers

    monkeypatch.setattr(batch_workers, "HANG_GRACE_S", 0.5)
    path = tmp_path / "in.txt"
    path.write_text("北京\n" + HANG + "\n", encoding="utf-8")
    started = time.monotonic()
    records = lines(
        run(tmp_path, [path], workers=1, record_timeout=0.2, factory=FakeFactory(hang=True))
    )
    assert time.monotonic() - started < 60  # killed each time: never a hung run
    assert records[0]["entities"] and records[1]["error"]["code"] == "deadline_exceeded"
    assert "killed each time" in records[1]["error"]["message"]


def test_batch_cli_record_timeout_option(fake_cli: CliRunner) -> None:
    result = fake_cli.invoke(
        main, ["extract", "-", "--workers", "0", "--record-timeout", "5"], input="张三\n"
    )
    assert result.exit_code == 0, result.output
    bad = fake_cli.invoke(main, ["extract", "-", "--record-timeout", "-1"], input="x\n")
    assert bad.exit_code == 2 and "--record-timeout" in bad.output


def test_batch_warns_when_the_workers_do_not_fit_the_memory_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from app.core import sizing

    tiny = sizing.Machine(8, sizing.Limit(None, "none"), sizing.Limit(2**30, "test limit"))
    monkeypatch.setattr(sizing.Machine, "probe", classmethod(lambda cls, *a, **k: tiny))
    (tmp_path / "model.json").write_text("{}")
    path = tmp_path / "in.txt"
    path.write_text("张三\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="app.batch.runner"):
        run(tmp_path, [path], workers=2)
    assert any("test limit" in r.getMessage() and "OOM" in r.getMessage() for r in caplog.records)


# -- audit of spo extract: inputs, ids and outputs that stopped or spoiled a run ------------------------
def _no_model(*_: Any, **__: Any) -> Any:
    raise AssertionError("the model was loaded for a run that is refused")


def test_batch_pipe_input_is_streamed_as_stdin_is(tmp_path: Path) -> None:
    """``spo extract <(printf 'x\\ny\\n')``: the resume fingerprint read the pipe empty, then the run
    failed after its model loaded ("not seekable"), leaving an empty output and a checkpoint."""
    read, write = os.pipe()
    os.write(write, "张三\n北京\n".encode())
    os.close(write)
    try:
        out = run(tmp_path, [Path(f"/dev/fd/{read}")], input_format="txt")
    finally:
        os.close(read)
    records = lines(out)
    assert [r["id"] for r in records] == [1, 2]
    assert [e["text"] for r in records for e in r["entities"]] == ["张三", "北京"]
    assert not (tmp_path / "out.jsonl.checkpoint.json").exists()


def test_batch_fifo_input_loses_no_data(tmp_path: Path) -> None:
    """A named FIFO (gzip here) is opened once: its first writer's data was read by the fingerprint
    and lost, and the run then waited for a second writer."""
    import threading

    fifo = tmp_path / "in.jsonl.gz"
    os.mkfifo(fifo)
    data = gzip.compress(
        b"".join(b'{"id": "r%d", "text": "\xe5\x8c\x97\xe4\xba\xac"}\n' % i for i in range(5))
    )
    finished = threading.Event()

    def feed() -> None:
        with open(fifo, "wb") as fh:
            fh.write(data)
        # A reader that opens the FIFO a second time would wait for ever: after a while, give it
        # an end of file so that the test fails instead of hanging.
        while not finished.wait(3):
            with contextlib.suppress(OSError):  # ENXIO: no reader right now
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        out = run(tmp_path, [fifo])
    finally:
        finished.set()
        feeder.join(10)
    assert [r["id"] for r in lines(out)] == [f"r{i}" for i in range(5)]


def test_batch_deeply_nested_id_is_an_error_record_not_a_crash(tmp_path: Path) -> None:
    """An id 500 lists deep crashed Checkpoint.save (RecursionError) and every --resume after it."""
    path = tmp_path / "deep.jsonl"
    deep = "[" * 500 + "]" * 500
    path.write_text(f'{{"id": "a", "text": "北京"}}\n{{"id": {deep}, "text": "x"}}\n')
    summary = run_batch(batch_options(tmp_path, [path], window=2), factory=FAKE)
    records = lines(tmp_path / "out.jsonl")
    assert [r["id"] for r in records] == ["a", 2]
    assert records[1]["error"]["code"] == "invalid_input" and summary.errors == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.jsonl", "out.jsonl"]


def test_batch_overflowing_number_is_never_written_as_infinity(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(
        '{"id": 1e400, "text": "x"}\n{"id": -1e400, "text": "x"}\n{"id": "ok", "text": "x"}\n'
    )
    out = run(tmp_path, [path])
    assert b"Infinity" not in out.read_bytes()
    records = lines(out)  # json.loads reads Infinity: the bytes above are what says it is not there
    assert [(r["id"], r.get("error", {}).get("code")) for r in records] == [
        (1, "invalid_json"),
        (2, "invalid_json"),
        ("ok", None),
    ]


def test_batch_output_name_too_long_for_its_checkpoint_is_refused_up_front(tmp_path: Path) -> None:
    """An output name of 251 bytes is valid, its checkpoint's is not: an OSError traceback (Errno 36)."""
    path = tmp_path / "in.txt"
    path.write_text("北京\n", encoding="utf-8")
    name = "o" * 245 + ".jsonl"
    with pytest.raises(
        OutputError, match=r"too long: its checkpoint sidecar's name .* 271 bytes"
    ) as err:
        run(tmp_path, [path], name=name, factory=_no_model)
    assert "\n" not in str(err.value) and "at most 235 bytes" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
    longest = "o" * 229 + ".jsonl"  # 235 bytes: its checkpoint's temporary name is 255
    assert [r["id"] for r in lines(run(tmp_path, [path], name=longest))] == [1]


def test_batch_corrupt_gzip_input_says_the_output_may_hold_its_garbage(tmp_path: Path) -> None:
    """A flipped bit inflates to garbage that gzip finds only at the stream's end (its CRC): the
    records written before cannot be called complete."""
    text = "".join(f"张三在北京{i}\n" for i in range(3000)).encode()
    path = tmp_path / "in.txt.gz"
    path.write_bytes(_gzip_with_a_bad_crc(text))
    with pytest.raises(InputError, match="CRC") as err:
        run(tmp_path, [path], window=64)
    message = str(err.value)
    assert "the input is corrupt" in message and "--force" in message
    assert "complete" not in message
    assert len(lines(tmp_path / "out.jsonl")) >= 64  # records were written (and checkpointed)


def _gzip_with_a_bad_crc(data: bytes) -> bytes:
    """``data`` gzipped, with the first bit flip past its middle that inflates without an error
    and fails only the CRC check at the end."""
    import zlib

    packed = bytearray(gzip.compress(data, mtime=0))
    for at in range(len(packed) // 2, len(packed) - 8):
        for bit in range(8):
            packed[at] ^= 1 << bit
            try:
                gzip.decompress(bytes(packed))
            except gzip.BadGzipFile as exc:
                if "CRC" in str(exc):
                    return bytes(packed)
            except (zlib.error, EOFError):
                pass
            packed[at] ^= 1 << bit
    raise AssertionError("no bit flip fails only the CRC")


def test_batch_cli_stopped_while_its_model_loads_says_the_output_is_as_it_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An interrupted --force run said "add --resume"; --resume then refused, calling the old output
    complete. Nothing was written: the output is as it was, and the message says so."""
    import app.batch.command as command

    def interrupted_load(options: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(
        command, "run_batch", functools.partial(run_batch, factory=interrupted_load)
    )
    (tmp_path / "a.txt").write_text("x\n")
    out = tmp_path / "o.jsonl"
    out.write_text('{"id":1,"entities":[],"triples":[]}\n')
    args = ["extract", str(tmp_path / "a.txt"), "--workers", "0", "-o"]
    forced = CliRunner().invoke(main, [*args, str(out), "--force"])
    assert forced.exit_code == 130
    assert f"nothing was written: {out} is as it was" in forced.stderr
    assert "--resume" not in forced.stderr
    assert out.read_text() == '{"id":1,"entities":[],"triples":[]}\n'
    fresh = CliRunner().invoke(main, [*args, str(tmp_path / "new.jsonl")])
    assert fresh.exit_code == 130 and "nothing was written" in fresh.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "o.jsonl"]


def test_batch_refuses_stdin_named_again_and_stdout_onto_an_input(tmp_path: Path) -> None:
    """``- /dev/stdin`` read stdin twice (every record written twice); ``>> in.txt`` read its own
    records back as input, growing the file until the disk was full."""
    path = tmp_path / "in.txt"
    path.write_text("张三在北京\n", encoding="utf-8")
    with path.open("rb") as stdin:
        options = BatchOptions(inputs=("-", str(path)), output="-", model_dir=tmp_path, workers=0)
        with pytest.raises(BatchError, match=f"the input {path} is stdin"):
            run_batch(options, factory=FAKE, stdin=stdin)
    with path.open("ab") as stdout:
        options = BatchOptions(inputs=(str(path),), output="-", model_dir=tmp_path, workers=0)
        with pytest.raises(BatchError, match=f"stdout is the input {path}"):
            run_batch(options, factory=FAKE, stdout=stdout)
    assert path.read_text(encoding="utf-8") == "张三在北京\n"


def test_batch_a_model_file_it_cannot_read_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unreadable model.json (another user's) ended ``spo extract`` in a PermissionError
    traceback from the resume fingerprint, before the load could name it."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.json").write_text("{}", encoding="utf-8")
    read_bytes = Path.read_bytes

    def denied(self: Path) -> bytes:
        if self.name == "model.json":
            raise PermissionError(13, "Permission denied")
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", denied)
    (tmp_path / "in.txt").write_text("x\n", encoding="utf-8")
    options = BatchOptions(inputs=(str(tmp_path / "in.txt"),), model_dir=model, workers=0)
    with pytest.raises(
        BatchError, match=f"cannot read the model's {model / 'model.json'}: Permission denied"
    ):
        run_batch(options, factory=FAKE)


def test_batch_refuses_stdin_from_the_output_and_stdout_onto_stdins_file(tmp_path: Path) -> None:
    """``- -o out.txt < out.txt`` emptied its input and reported success; ``- < in.txt >> in.txt``
    read its own records back, the file growing until the disk was full. A terminal is stdin and
    stdout of every interactive run, and is no loop."""
    path = tmp_path / "in.txt"
    path.write_text("张三在北京\n", encoding="utf-8")
    with path.open("rb") as stdin:
        options = BatchOptions(inputs=("-",), output=str(path), model_dir=tmp_path, workers=0)
        with pytest.raises(BatchError, match=f"the output {path} is the file stdin"):
            run_batch(options, factory=FAKE, stdin=stdin)
        forced = dataclasses.replace(options, force=True)
        with pytest.raises(BatchError, match="writing it would destroy the input"):
            run_batch(forced, factory=FAKE, stdin=stdin)
    with path.open("rb") as stdin, path.open("ab") as stdout:
        options = BatchOptions(inputs=("-",), output="-", model_dir=tmp_path, workers=0)
        with pytest.raises(BatchError, match="stdout is the file stdin"):
            run_batch(options, factory=FAKE, stdin=stdin, stdout=stdout)
    assert path.read_text(encoding="utf-8") == "张三在北京\n"
    read, write = os.pipe()  # not a regular file: no loop to refuse
    with os.fdopen(read, "rb") as stdin, os.fdopen(write, "wb") as pipe_out:
        pipe_out.write("张三在北京\n".encode())
        pipe_out.close()
        out = tmp_path / "out.jsonl"
        options = BatchOptions(inputs=("-",), output=str(out), model_dir=tmp_path, workers=0)
        assert run_batch(options, factory=FAKE, stdin=stdin).records == 1


@pytest.mark.parametrize(
    ("inputs", "output", "message"),
    [(("",), "-", "an input is an empty name"), (("a.txt",), "", "-o is an empty name")],
)
def test_batch_an_empty_name_is_a_usage_error(
    inputs: tuple[str, ...], output: str, message: str
) -> None:
    result = CliRunner().invoke(main, ["extract", *inputs, "-o", output, "--input-format", "txt"])
    assert result.exit_code == 2 and message in result.output, result.output


_CLI_WITH_FAKE = (
    "import functools, sys; from app.batch import command, run_batch; "
    "from tests.app.test_batch_fakes import FakeFactory; "
    "command.run_batch = functools.partial(run_batch, factory=FakeFactory()); "
    "from app.cli import main; main(sys.argv[1:])"
)


@pytest.mark.parametrize(
    ("closed", "args", "code", "message"),
    [
        (0, ["extract", "in.txt", "-o", "o.jsonl", "--workers", "0"], 0, "1 records"),
        (1, ["extract", "in.txt", "-o", "o.jsonl", "--workers", "0"], 0, "1 records"),
        (0, ["extract", "-", "-o", "o.jsonl"], 2, "stdin is closed"),
        (1, ["extract", "in.txt"], 2, "stdout is closed"),
        (1, ["make-corpus", "-", "--n", "3"], 2, "stdout is closed"),
    ],
)
def test_batch_cli_started_with_a_stream_closed(
    tmp_path: Path, closed: int, args: list[str], code: int, message: str
) -> None:
    """A cron job's closed stdin (or ``>&-``) was an AttributeError traceback, used or not."""
    import subprocess
    import sys

    (tmp_path / "in.txt").write_text("张三在北京\n", encoding="utf-8")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", _CLI_WITH_FAKE, *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root)},
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.close(closed),
        timeout=120,
    )
    stderr = result.stderr.decode()
    assert result.returncode == code, stderr
    assert message in stderr and "Traceback" not in stderr
    if code == 0:
        assert len(lines(tmp_path / "o.jsonl")) == 1


def test_batch_cli_an_input_of_unknown_format_is_a_usage_error(
    fake_cli: CliRunner, tmp_path: Path
) -> None:
    (tmp_path / "data").write_text("x\n")
    result = fake_cli.invoke(main, ["extract", str(tmp_path / "data")])
    assert result.exit_code == 2 and "--input-format" in result.stderr


def test_batch_cut_gzip_input_says_to_start_again_once_it_is_whole(tmp_path: Path) -> None:
    text = "".join(f"张三在北京{i}\n" for i in range(3000)).encode()
    path = tmp_path / "in.txt.gz"
    path.write_bytes(gzip.compress(text)[:-200])
    with pytest.raises(InputError, match="cut short") as err:
        run(tmp_path, [path], window=64)
    assert "--force" in str(err.value) and "resumable" not in str(err.value)
    # Cut inside its header, or a header that is no gzip's: the check for UTF-16 before the model
    # loads (which reads the start) let gzip's own EOFError / BadGzipFile out, a traceback.
    for head in (b"\x1f\x8b", b"\x1f\x8b\x09" + b"\x00" * 20):
        path.write_bytes(head)
        with pytest.raises(InputError):
            run(tmp_path, [path], name=f"out{len(head)}.jsonl", window=64)
