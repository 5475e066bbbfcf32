"""``spo extract`` on the real tiny model: CLI in process and as a real subprocess (stdin/stdout),
mixed and extreme records, workers 1 vs 2, and ``kill -9`` of a real run then ``--resume``."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from app.batch import BatchOptions, run_batch
from app.cli import main

ROOT = Path(__file__).resolve().parents[2]
SPO = [sys.executable, "-c", "from app.cli import main; main()"]


def short_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    chars = "张三出生于北京市李四的妻子是王五《红楼梦》作者曹雪芹，。abc 😀"
    return ["".join(rng.choices(chars, k=rng.randint(1, 24))) for _ in range(n)]


def check(records: list[dict[str, Any]], texts: dict[Any, str]) -> None:
    """Every span is a slice of its own text (offsets in characters, end exclusive)."""
    for rec in records:
        text = texts[rec["id"]]
        spans = [*rec.get("entities", [])]
        spans += [t[k] for t in rec.get("triples", []) for k in ("subject", "object")]
        for span in spans:
            assert 0 <= span["start"] < span["end"] <= len(text)
            assert text[span["start"] : span["end"]] == span["text"]


def test_batch_model_mixed_and_extreme_records_in_process(
    tmp_path: Path, triples_model_dir: Path
) -> None:
    texts = {
        "plain": "张三出生于北京，李四的妻子是王五。",
        "fullwidth": "（张三）出生于北京！？；：“王五”",
        "emoji": "😀张三😀出生于😀北京",
        "combining": "Cafe\u0301 张三 e\u0301\u0301 北京",
        "windowed": "张三出生于北京。" * 30,  # far over the model's 64 tokens: windows
        "spaces": "  \u3000张 三\t北京  ",
        "empty": "",
    }
    rows = [json.dumps({"id": k, "text": v}, ensure_ascii=False) for k, v in texts.items()]
    rows[3:3] = [
        '{"id": "too-long", "text": "' + "张" * 301 + '"}',
        '{"id": "surrogate", "text": "\\ud83d北京"}',
        "{oops",
        '{"id": "number", "text": 3}',
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    args = ["extract", str(path), "-o", str(out), "--model-dir", str(triples_model_dir)]
    result = CliRunner().invoke(main, [*args, "--workers", "0", "--max-text-chars", "300"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == len(rows)
    assert [r["id"] for r in records] == [json.loads(r)["id"] if r != "{oops" else 6 for r in rows]
    errors = {r["id"]: r["error"]["code"] for r in records if "error" in r}
    assert errors == {
        "too-long": "text_too_long",
        "surrogate": "invalid_input",
        6: "invalid_json",
        "number": "invalid_input",
    }
    check([r for r in records if "error" not in r], texts)
    assert sum(len(r.get("triples", [])) for r in records) > 0, "the tiny model finds triples"
    assert "11 records, 4 errors" in result.stderr


def test_batch_model_stdin_stdout_real_subprocess(triples_model_dir: Path) -> None:
    proc = subprocess.run(
        [*SPO, "extract", "-", "--model-dir", str(triples_model_dir)],
        input="张三出生于北京\n".encode(),
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    (line,) = proc.stdout.decode().splitlines()
    record = json.loads(line)
    assert record["id"] == 1 and set(record) == {"id", "entities", "triples"}
    check([record], {1: "张三出生于北京"})
    assert b"1 records, 0 errors" in proc.stderr


@pytest.mark.slow
def test_batch_model_workers_and_kill_resume_are_byte_identical(
    tmp_path: Path, triples_model_dir: Path
) -> None:
    texts = short_texts(3000)
    path = tmp_path / "in.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")

    def options(out: str, **changes: Any) -> BatchOptions:
        base = {"window": 64, "chunk_size": 16, "model_dir": triples_model_dir}
        return BatchOptions(inputs=(str(path),), output=str(tmp_path / out), **{**base, **changes})

    run_batch(options("w0.jsonl", workers=0))
    ref = (tmp_path / "w0.jsonl").read_bytes()
    check([json.loads(x) for x in ref.splitlines()], dict(enumerate(texts, 1)))
    run_batch(options("w2.jsonl", workers=2))
    assert (tmp_path / "w2.jsonl").read_bytes() == ref

    # A real `spo extract --workers 1`, killed -9 once a few windows are checkpointed.
    out = tmp_path / "out.jsonl"
    sidecar = tmp_path / "out.jsonl.checkpoint.json"
    cmd = [*SPO, "extract", str(path), "-o", str(out), "--model-dir", str(triples_model_dir)]
    cmd += ["--window", "64", "-q"]
    proc = subprocess.Popen([*cmd, "--workers", "1"], cwd=ROOT, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    done = 0
    while time.monotonic() < deadline and proc.poll() is None and done < 192:
        with contextlib.suppress(OSError, ValueError):  # not written yet, or mid-replace
            done = json.loads(sidecar.read_text())["done"]
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert 0 < out.stat().st_size < len(ref), "killed mid-run"
    refused = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=120)
    assert refused.returncode == 1 and b"--resume" in refused.stderr
    resumed = subprocess.run([*cmd, "--resume"], cwd=ROOT, capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    assert out.read_bytes() == ref
    assert not sidecar.exists()

    # SIGTERM (a container stopped or evicted) ends it as Ctrl-C does: 128 + 15, and how to go on.
    proc = subprocess.Popen([*cmd, "--workers", "1", "--force"], cwd=ROOT, stderr=subprocess.PIPE)
    done, deadline = 0, time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and done < 192:
        with contextlib.suppress(OSError, ValueError):
            done = json.loads(sidecar.read_text())["done"]
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err.decode()[-2000:]
    assert (
        b"spo extract: terminated (SIGTERM); the output so far ends at the last checkpoint" in err
    )
    assert b"Traceback" not in err and 0 < out.stat().st_size < len(ref)
    resumed = subprocess.run([*cmd, "--resume"], cwd=ROOT, capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    assert out.read_bytes() == ref


@pytest.mark.parametrize("workers", ["0", "1"])
def test_batch_model_a_bad_model_stops_the_run_with_its_own_code(
    triples_model_dir: Path, tmp_path: Path, workers: str
) -> None:
    """In a worker process, a manifest error was told as ``model_load_error: worker could not load
    the model: invalid_manifest: ...``; in this process, as ``invalid_manifest: ...`` (what
    docs/batch.md says a run's message starts with)."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(triples_model_dir, model)
    doc = json.loads((model / "model.json").read_text(encoding="utf-8"))
    doc["treshold"] = doc.pop("threshold")
    (model / "model.json").write_text(json.dumps(doc), encoding="utf-8")
    (tmp_path / "in.txt").write_text("李白\n", encoding="utf-8")
    result = CliRunner().invoke(
        main, ["extract", str(tmp_path / "in.txt"), "-m", str(model), "--workers", workers,
               "-o", str(tmp_path / "out.jsonl")],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: invalid_manifest: model.json: field 'treshold'")
    assert not (tmp_path / "out.jsonl").exists()
