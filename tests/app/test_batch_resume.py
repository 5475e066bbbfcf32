"""Kill -9 at several points of a real ``run_batch`` process, then ``--resume``: the output is
byte-identical to an uninterrupted run (no duplicate, no gap) and the checkpoint is gone."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app.batch import BatchOptions, run_batch
from app.batch.output import FileOutput, OutputError
from app.batch.runner import BatchError
from tests.app.test_batch import mixed_texts
from tests.app.test_batch_fakes import FakeExtractor, FakeFactory

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "from tests.app.test_batch_fakes import crash_run; crash_run()"


@pytest.fixture
def job(tmp_path: Path) -> dict[str, Any]:
    """A 1000-record input with some bad lines, and its uninterrupted output."""
    texts = mixed_texts(1000, seed=5)
    rows = [json.dumps({"id": f"r{i}", "text": t}, ensure_ascii=False) for i, t in enumerate(texts)]
    rows[10] = "{broken"
    rows[500] = '{"id": "long", "text": "' + "北" * 60 + '"}'
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    options: dict[str, Any] = {
        "inputs": [str(path)],
        "output": str(tmp_path / "out.jsonl"),
        "model_dir": str(tmp_path),
        "workers": 0,
        "window": 64,
        "chunk_size": 16,
        "max_text_chars": 50,
    }
    ref = tmp_path / "ref.jsonl"
    run_batch(
        BatchOptions(**{**options, "inputs": (str(path),), "output": str(ref)}),
        factory=FakeFactory(),
    )
    return {"options": options, "ref": ref.read_bytes(), "out": tmp_path / "out.jsonl"}


def crash(config: dict[str, Any], *, wait: bool = True) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps(config)], cwd=ROOT, stderr=subprocess.PIPE
    )
    if wait:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, err.decode()
    return proc


def resume(job: dict[str, Any], **changes: Any) -> None:
    opts = {**job["options"], **changes, "resume": True}
    run_batch(BatchOptions(**{**opts, "inputs": tuple(opts["inputs"])}), factory=FakeFactory())


def wait_for_checkpoint(out: Path, done: int) -> Path:
    """The checkpoint sidecar of ``out``, once a running job has checkpointed ``done`` records."""
    sidecar = out.with_name(out.name + ".checkpoint.json")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if json.loads(sidecar.read_text())["done"] >= done:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    return sidecar


@pytest.mark.parametrize(
    ("factory", "point"),
    [
        ({"kill_on_load": True}, None),  # while the model loads: a checkpoint of nothing
        ({"kill_on_call": 1}, None),  # before the first window is written
        ({"kill_on_call": 9}, None),  # in the middle of a window
        ({"kill_on_call": 50}, None),  # later
        ({}, ["checkpoint", 4]),  # window 3 written and fsynced, its checkpoint not
        ({}, ["write", 5]),  # half of window 5 written
        ({}, ["write", 1]),  # half of the first window
    ],
)
def test_batch_resume_after_kill_is_byte_identical(
    job: dict[str, Any], factory: dict[str, Any], point: list[Any] | None
) -> None:
    crash({"options": job["options"], "factory": factory, "point": point})
    out: Path = job["out"]
    partial = out.read_bytes()
    assert job["ref"].startswith(partial[: partial.rfind(b"\n") + 1])
    assert out.with_name("out.jsonl.checkpoint.json").exists()
    with pytest.raises(OutputError, match="--resume"):
        run_batch(
            BatchOptions(**{**job["options"], "inputs": tuple(job["options"]["inputs"])}),
            factory=FakeFactory(),
        )
    resume(job)
    assert out.read_bytes() == job["ref"]
    assert not out.with_name("out.jsonl.checkpoint.json").exists()


def test_batch_resume_after_external_kill_with_workers(job: dict[str, Any]) -> None:
    options = {**job["options"], "workers": 2}
    proc = crash({"options": options, "factory": {"delay": 0.02}}, wait=False)
    wait_for_checkpoint(job["out"], 128)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert job["out"].stat().st_size < len(job["ref"])
    resume(job, workers=2)
    assert job["out"].read_bytes() == job["ref"]


def test_batch_resume_refuses_changed_options_or_input(job: dict[str, Any]) -> None:
    crash({"options": job["options"], "factory": {"kill_on_call": 20}})
    with pytest.raises(OutputError, match="window: 64 -> 32"):
        resume(job, window=32)
    with pytest.raises(OutputError, match="text_field"):
        resume(job, text_field="body")
    path = Path(job["options"]["inputs"][0])
    path.write_text(path.read_text(encoding="utf-8").replace("r1", "R1", 1), encoding="utf-8")
    with pytest.raises(OutputError, match="inputs"):
        resume(job)


def test_batch_resume_refuses_an_edited_output(job: dict[str, Any]) -> None:
    crash({"options": job["options"], "factory": {"kill_on_call": 20}})
    out: Path = job["out"]
    out.write_bytes(out.read_bytes()[:100])
    with pytest.raises(OutputError, match="shorter"):
        resume(job)


def test_batch_an_output_removed_after_a_kill_is_named_missing_not_existing(
    job: dict[str, Any],
) -> None:
    """Only the checkpoint left: the run said the output "already exists" and to add --resume,
    which then said it was missing. Now it says so, and --force starts over."""
    crash({"options": job["options"], "factory": {"kill_on_call": 20}})
    out: Path = job["out"]
    out.unlink()
    options = BatchOptions(**{**job["options"], "inputs": tuple(job["options"]["inputs"])})
    with pytest.raises(OutputError, match="is missing but its checkpoint") as refused:
        run_batch(options, factory=FakeFactory())
    assert "--force to start over" in str(refused.value) and "--resume" not in str(refused.value)
    with pytest.raises(OutputError, match="is missing"):
        resume(job)
    run_batch(dataclasses.replace(options, force=True), factory=FakeFactory())
    assert out.read_bytes() == job["ref"]


def test_batch_resume_with_nothing_written_starts_fresh(job: dict[str, Any]) -> None:
    resume(job)
    assert job["out"].read_bytes() == job["ref"]


def _no_model(*_: Any, **__: Any) -> Any:
    raise AssertionError("the model was loaded for a run that is refused")


def test_batch_refuses_an_output_another_run_is_writing(job: dict[str, Any]) -> None:
    """A second run on an output in progress (a cron job overlapping the last one) is refused before
    its model loads, whatever its flags; the first run's output comes out whole."""
    proc = crash({"options": job["options"], "factory": {"delay": 0.01}}, wait=False)
    sidecar = wait_for_checkpoint(job["out"], 128)
    base = {**job["options"], "inputs": tuple(job["options"]["inputs"])}
    for flags in ({"resume": True}, {"force": True, "max_text_chars": 40}, {}):
        with pytest.raises(OutputError, match="being written by another spo extract run"):
            run_batch(BatchOptions(**{**base, **flags}), factory=_no_model)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert job["out"].read_bytes() == job["ref"]
    assert not sidecar.exists()


@pytest.mark.parametrize(
    ("first", "second", "interrupted"),
    [
        ({}, {}, False),  # the cron job again: it finished first, the second replaced its output
        ({}, {"force": True}, False),
        ({"force": True}, {}, False),  # refused only as "already exists", after a reload
        ({"resume": True}, {"resume": True}, True),  # two resumes 0.5 s apart: both accepted
        ({"resume": True}, {"force": True}, True),
    ],
)
def test_batch_refuses_a_run_that_starts_while_another_loads_its_model(
    job: dict[str, Any], first: dict[str, Any], second: dict[str, Any], interrupted: bool
) -> None:
    """The output is claimed (locked, then checked) before the model loads: a second run started
    meanwhile is refused before its own model loads, so it can neither replace the first's output
    once that has finished nor resume what the first resumes. (The lock was taken after the model
    loaded: a run that finished in between was silently replaced.)"""
    if interrupted:
        crash({"options": job["options"], "factory": {"kill_on_call": 20}})
    elif first.get("force"):
        job["out"].write_text("an old output\n")
    base = {**job["options"], "inputs": tuple(job["options"]["inputs"])}
    loaded: list[str] = []
    refusals: list[str] = []

    def record_load(options: Any) -> FakeExtractor:
        loaded.append("second")
        return FakeFactory()(options)

    def load_running_another(options: Any) -> FakeExtractor:
        try:  # the second run, from start to end, while the first "loads its model"
            run_batch(BatchOptions(**{**base, **second}), factory=record_load)
        except OutputError as exc:
            refusals.append(str(exc))
        return FakeFactory()(options)

    run_batch(BatchOptions(**{**base, **first}), factory=load_running_another)
    assert loaded == [] and len(refusals) == 1
    assert "being written by another spo extract run right now" in refusals[0]
    assert job["out"].read_bytes() == job["ref"]
    assert not job["out"].with_name("out.jsonl.checkpoint.json").exists()


def test_batch_refused_or_failed_run_leaves_the_output_as_it_found_it(job: dict[str, Any]) -> None:
    """What a claim creates (an empty output and its first checkpoint) goes when the run stops
    before writing: a model that does not load leaves no file that looks like an output."""
    base = {**job["options"], "inputs": tuple(job["options"]["inputs"])}
    with pytest.raises(AssertionError, match="the model was loaded"):
        run_batch(BatchOptions(**base), factory=_no_model)
    assert not job["out"].exists()
    assert not job["out"].with_name("out.jsonl.checkpoint.json").exists()
    run_batch(BatchOptions(**base), factory=FakeFactory())
    assert job["out"].read_bytes() == job["ref"]


def test_output_is_locked_before_it_is_changed(tmp_path: Path) -> None:
    """Two runs that both passed their checks: the second to open touches neither the file nor the
    checkpoint of the first, and can write once the first has ended."""
    path = tmp_path / "out.jsonl"
    second = FileOutput(path, {"run": 2}, resume=False, force=True)
    first = FileOutput(path, {"run": 1}, resume=False, force=False)
    first.open()
    first.write_window(b'{"id":1}\n', 1, 0, 1)
    sidecar = path.with_name("out.jsonl.checkpoint.json")
    saved = sidecar.read_bytes()
    with pytest.raises(OutputError, match="being written by another"):
        second.open()
    assert path.read_bytes() == b'{"id":1}\n'
    assert sidecar.read_bytes() == saved
    first.write_window(b'{"id":2}\n', 1, 0, 2)
    first.finish()
    assert path.read_bytes() == b'{"id":1}\n{"id":2}\n'
    assert not sidecar.exists()
    second.open()
    second.write_window(b'{"id":"x"}\n', 1, 0, "x")
    second.finish()
    assert path.read_bytes() == b'{"id":"x"}\n'


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"done": "5"}, "done is '5', not a count"),
        ({"done": -1}, "done is -1, not a count"),
        ({"bytes": 2816.0}, "bytes is 2816.0, not a count"),
        ({"errors": "x"}, "errors is 'x', not a count"),
        ({"done": True}, "done is True, not a count"),
        ({"fingerprint": ["a"]}, "fingerprint is not an object"),
        ({"done": 0}, "done 0"),  # bytes written, no record counted: all would be written again
    ],
)
def test_batch_resume_refuses_a_checkpoint_of_the_wrong_shape(
    job: dict[str, Any], edit: dict[str, Any], problem: str
) -> None:
    crash({"options": job["options"], "factory": {"kill_on_call": 20}})
    sidecar = job["out"].with_name("out.jsonl.checkpoint.json")
    doc = json.loads(sidecar.read_text())
    assert doc["done"] > 0 and doc["bytes"] > 0
    sidecar.write_text(json.dumps({**doc, **edit}))
    with pytest.raises(OutputError, match=f"unreadable checkpoint .*{problem}"):
        resume(job)
    sidecar.write_text("[1]")
    with pytest.raises(OutputError, match=r"unreadable checkpoint .*not an object"):
        resume(job)


def test_batch_resume_refuses_a_checkpoint_whose_count_disagrees_with_the_output(
    job: dict[str, Any],
) -> None:
    """Fewer records counted than the output holds up to the checkpoint: the input records after
    the count would be written twice (5,816 lines for 3,000 inputs, exit 0)."""
    crash({"options": job["options"], "factory": {"kill_on_call": 20}})
    sidecar = job["out"].with_name("out.jsonl.checkpoint.json")
    doc = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**doc, "done": doc["done"] - 5, "errors": 0}))
    with pytest.raises(
        OutputError, match=f"holds {doc['done']} records .* counts {doc['done'] - 5}"
    ):
        resume(job)


def test_batch_refuses_an_input_that_is_the_outputs_checkpoint(tmp_path: Path) -> None:
    """The run replaced the input with its checkpoint, read that back, then deleted it."""
    sidecar = tmp_path / "o.jsonl.checkpoint.json"
    sidecar.write_text('{"id": "a", "text": "李白"}\n', encoding="utf-8")
    options = BatchOptions(
        inputs=(str(sidecar),),
        output=str(tmp_path / "o.jsonl"),
        model_dir=str(tmp_path),
        workers=0,
        force=True,
    )
    with pytest.raises(BatchError, match="is the output's checkpoint"):
        run_batch(options, factory=_no_model)
    assert sidecar.read_text(encoding="utf-8") == '{"id": "a", "text": "李白"}\n'
    assert not (tmp_path / "o.jsonl").exists()


def test_batch_refuses_a_dangling_symlink_as_output(tmp_path: Path) -> None:
    """O_EXCL never follows a link, a plain open finds nothing: the run looped for good."""
    source = tmp_path / "in.txt"
    source.write_text("李白\n", encoding="utf-8")
    link = tmp_path / "out.jsonl"
    link.symlink_to(tmp_path / "missing" / "target.jsonl")
    options = BatchOptions(
        inputs=(str(source),), output=str(link), model_dir=str(tmp_path), workers=0
    )
    with pytest.raises(OutputError, match=r"symbolic link to .*does not exist"):
        run_batch(options, factory=_no_model)
    assert link.is_symlink()


def test_batch_a_checkpoint_that_cannot_be_saved_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while the checkpoint was written left an empty ``.tmp`` beside the output."""
    import errno

    from app.batch.output import TMP_SUFFIX, Checkpoint

    sidecar = tmp_path / "out.jsonl.checkpoint.json"
    Checkpoint({"inputs": []}, done=3, bytes=90).save(sidecar)
    before = sidecar.read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        Checkpoint({"inputs": []}, done=5, bytes=150).save(sidecar)
    assert sidecar.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [sidecar.name]
    assert not (tmp_path / (sidecar.name + TMP_SUFFIX)).exists()
