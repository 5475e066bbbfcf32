"""``python -m bench`` fails cleanly (issue 20: ``python -m bench peer`` on a fresh checkout died with
a traceback until ``python -m bench model`` had run). The steps themselves are measurements, run by
hand (BENCHMARKS.md), not here."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import bench.common
import bench.peer
import bench.rbt6
from bench.__main__ import main
from bench.runner import run_worker


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty benchmark cache, as on a fresh checkout."""
    cache = tmp_path / "cache"
    monkeypatch.setattr(bench.common, "CACHE_DIR", cache)
    monkeypatch.setattr(bench.rbt6, "CACHE_DIR", cache)
    return cache


def test_bench_peer_without_onnx_runtime_says_so_and_builds_nothing(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from training.onnx_export import OnnxExportError

    def missing() -> None:
        raise OnnxExportError("the onnx extra is not installed (make extra-onnx)")

    monkeypatch.setattr("training.onnx_export._require_tools", missing)
    with caplog.at_level(logging.INFO):
        main(["peer"])
    assert "peer step skipped: the onnx extra is not installed" in caplog.text
    assert "step peer done" in caplog.text
    assert not fresh_cache.exists()  # nothing built for a step that does not run


def test_bench_peer_builds_the_model_before_converting_it(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a fresh checkout the peer step builds the RBT6 model (what ``python -m bench model``
    does) before it converts that model for ONNX Runtime."""
    calls: list[str] = []
    monkeypatch.setattr("training.onnx_export._require_tools", lambda: None)
    monkeypatch.setattr(bench.rbt6, "build_model", lambda: calls.append("build_model") or {})

    def convert() -> dict[str, str]:
        calls.append("onnx_dirs")
        raise RuntimeError("stop here")

    monkeypatch.setattr(bench.peer, "onnx_dirs", convert)
    with pytest.raises(RuntimeError, match="stop here"):
        bench.peer.run()
    assert calls == ["build_model", "onnx_dirs"]


def test_bench_failed_worker_ends_the_run_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    def run(**options: Any) -> None:
        run_worker("peer", "--no-such-option")  # the worker refuses it and exits 2

    monkeypatch.setattr(bench.peer, "run", run)
    with pytest.raises(SystemExit) as info:
        main(["peer"])
    assert info.value.code == 1
    err = capfd.readouterr().err  # the worker's own output, then the run's last line
    assert err.endswith(
        "python -m bench peer: bench.worker peer failed (exit status 2); its output is above\n"
    )
    assert "--no-such-option" in err and "Traceback" not in err


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_bench_stop_ends_a_server_even_one_that_ignores_sigterm(ignores_sigterm: bool) -> None:
    import subprocess
    import sys

    from bench.common import stop

    handler = "signal.SIG_IGN" if ignores_sigterm else "signal.SIG_DFL"
    code = f"import signal, time; signal.signal(signal.SIGTERM, {handler}); print(1, flush=True); time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"1\n"
    stop(process, wait_s=0.5)
    assert process.returncode == (-9 if ignores_sigterm else -15)
    process.stdout.close()


# -- issue 24: OpenVINO in the peer step, the matmul peak, service-level peers -----------------------


def _peer_doc(percall: dict[str, dict[str, float]], **extra: Any) -> dict[str, Any]:
    return {"shapes": [[1, 16], [1, 128], [8, 128]], "percall": percall, **extra}


def test_bench_peer_targets_hold_one_spo_mode_to_openvinos_fastest_at_every_bucket() -> None:
    doc = _peer_doc(
        {
            "spo-fp32": {"1x16": 20.0, "1x128": 80.0, "8x128": 500.0},
            "spo-int8": {"1x16": 8.0, "1x128": 40.0, "8x128": 200.0},
            "ov-fp32": {"1x16": 10.0, "1x128": 60.0, "8x128": 480.0},
            "ov-int8": {"1x16": 4.0, "1x128": 50.0, "8x128": 170.0},
        }
    )
    verdict = bench.peer.targets(doc)["fastest spo mode <= OpenVINO's fastest at every bucket"]
    # OpenVINO's fastest per bucket: ov-int8, ov-int8, ov-int8 (4, 50, 170 ms).
    assert verdict["peers"] == {"1x16": "ov-int8", "1x128": "ov-int8", "8x128": "ov-int8"}
    assert verdict["mode"] == "spo-int8"
    assert verdict["ratios"] == {"1x16": 2.0, "1x128": 0.8, "8x128": 1.18}
    assert verdict["met"] is False
    assert verdict["others"] == {"spo-fp32": {"1x16": 5.0, "1x128": 1.6, "8x128": 2.94}}


def test_bench_peer_targets_spo_int8_against_ort_and_openvino_int8() -> None:
    doc = _peer_doc(
        {
            "spo-int8": {"1x16": 10.0, "1x128": 38.0, "8x128": 260.0},
            "ort-int8": {"1x16": 10.0, "1x128": 40.0, "8x128": 250.0},
            "ov-int8": {"1x16": 2.0, "1x128": 30.0, "8x128": 200.0},
        }
    )
    got = bench.peer.targets(doc)
    assert got["spo-int8 <= ort-int8 at every bucket"] == {
        "ratios": {"1x16": 1.0, "1x128": 0.95, "8x128": 1.04},
        "met": False,
    }
    # From 128 tokens only (1 x 16 is five times slower and does not count): 1.27 and 1.3, met.
    within = got["spo-int8 within 1.3x of ov-int8 from 128 tokens"]
    assert within == {"ratios": {"1x128": 1.27, "8x128": 1.3}, "met": True}
    doc["percall"]["spo-int8"]["8x128"] = 262.0
    within = bench.peer.targets(doc)["spo-int8 within 1.3x of ov-int8 from 128 tokens"]
    assert within["ratios"]["8x128"] == 1.31 and within["met"] is False


def test_bench_peer_targets_int8_share_of_the_measured_int8_peak() -> None:
    flops = 8 * 128 * bench.rbt6.flops_per_token(128)
    # spo-int8 reaches exactly half the peak at 8 x 128 (one call of 100 ms), ov-int8 all of it.
    doc = _peer_doc(
        {"spo-int8": {"8x128": 100.0}, "ov-int8": {"8x128": 50.0}, "spo-fp32": {"8x128": 1.0}},
        matmul_peak_ops_per_s={"int8": 2 * flops / 0.1, "fp32": 1.0},
    )
    verdict = bench.peer.targets(doc)["spo-int8 >= 50% of the int8 matmul peak at 8 x 128"]
    assert verdict["ratios"] == {"8x128": 0.5} and verdict["met"] is True
    assert verdict["others"] == {"ov-int8": {"8x128": 1.0}}  # int8 runtimes only
    assert verdict["what"] == "share of the measured int8 matmul peak"
    doc["percall"]["spo-int8"]["8x128"] = 101.0
    assert (
        bench.peer.targets(doc)["spo-int8 >= 50% of the int8 matmul peak at 8 x 128"]["met"]
        is False
    )
    # Without a measured peak the target is not stated at all.
    del doc["matmul_peak_ops_per_s"]
    assert not any("peak" in name for name in bench.peer.targets(doc))


def test_bench_peer_share_table_uses_each_runtimes_own_precision_peak() -> None:
    fpt = bench.rbt6.flops_per_token(16)
    doc = _peer_doc(
        {
            "spo-fp32": {"1x16": 1000.0},
            "ov-bf16": {"1x16": 250.0},
            "ort-int8": {"1x16": 100.0},
        },
        matmul_peak_ops_per_s={"fp32": 16 * fpt / 0.5, "bf16": 16 * fpt / 0.1},
    )
    lines = bench.peer.share_table(doc)
    assert lines[0] == "| batch x length | spo-fp32 | ov-bf16 |"  # no int8 peak: ort-int8 left out
    assert lines[2] == "| 1 x 16 | 50% | 40% |"
    assert lines[3] == "| 1 x 128 | - | - |"
    assert bench.peer.share_table(_peer_doc({"spo-fp32": {"1x16": 1.0}})) == []


def test_bench_peer_without_openvino_says_so_and_compares_the_rest(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without OpenVINO (the extra, or its export module) the peer step runs without its columns."""
    sent: list[tuple[str, ...]] = []
    written: dict[str, Any] = {}
    monkeypatch.setattr("training.onnx_export._require_tools", lambda: None)
    monkeypatch.setattr(bench.rbt6, "build_model", lambda: {})
    monkeypatch.setattr(bench.peer, "onnx_dirs", lambda: {})
    monkeypatch.setattr(bench.peer, "precision_dirs", lambda: {})
    monkeypatch.setattr(bench.peer, "openvino_missing", lambda: "openvino is not installed")
    monkeypatch.setattr(bench.peer, "openvino_dirs", lambda: pytest.fail("nothing to convert"))
    monkeypatch.setattr(bench.peer, "read_result", lambda name: None)
    monkeypatch.setattr(bench.peer, "write_result", lambda name, doc: written.update(doc))

    def worker(mode: str, *args: str) -> dict[str, Any]:
        sent.append(args)
        return {"percall": {"spo-fp32": {"1x16": 20.0}}, "workload": {}}

    monkeypatch.setattr(bench.peer, "run_worker", worker)
    with caplog.at_level(logging.WARNING):
        bench.peer.run(rounds=1, texts=10)
    assert "peer step without OpenVINO: openvino is not installed" in caplog.text
    assert not any("openvino-" in a for a in sent[0])
    assert written["openvino"] == "openvino is not installed"


def test_bench_peer_sends_the_openvino_conversions_to_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[tuple[str, ...]] = []
    written: dict[str, Any] = {}
    monkeypatch.setattr("training.onnx_export._require_tools", lambda: None)
    monkeypatch.setattr(bench.rbt6, "build_model", lambda: {})
    monkeypatch.setattr(bench.peer, "onnx_dirs", lambda: {})
    monkeypatch.setattr(bench.peer, "precision_dirs", lambda: {"int8": "/m/int8"})
    monkeypatch.setattr(bench.peer, "openvino_missing", lambda: None)
    monkeypatch.setattr(bench.peer, "openvino_dirs", lambda: {"fp32": "/m/ov32", "int8": "/m/ov8"})
    here = bench.common.cpu_info() | {"family": 26, "model_number": 2}
    monkeypatch.setattr(bench.peer, "cpu_info", lambda: here)
    matmul = {"peak_ops_per_s": {"int8": 5e11}, "machine": here}
    monkeypatch.setattr(bench.peer, "read_result", lambda name: matmul)
    monkeypatch.setattr(bench.peer, "write_result", lambda name, doc: written.update(doc))
    monkeypatch.setattr(
        bench.peer, "run_worker", lambda mode, *args: sent.append(args) or {"percall": {}}
    )
    bench.peer.run(rounds=1, texts=10)
    args = list(sent[0])
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--mode-dir"]
    assert pairs == ["int8=/m/int8", "openvino-fp32=/m/ov32", "openvino-int8=/m/ov8"]
    assert written["openvino"] == "compared"
    assert written["matmul_peak_ops_per_s"] == {"int8": 5e11}
    # A peak measured on another machine is not a share of this one's.
    matmul["machine"] = here | {"family": -1}
    written.clear()
    bench.peer.run(rounds=1, texts=10)
    assert "matmul_peak_ops_per_s" not in written


@pytest.mark.parametrize(
    ("bf16_cpu", "expected"),
    [
        (True, {"ov-fp32": ("f", "fp32"), "ov-bf16": ("f", "bf16"), "ov-int8": ("i", "int8")}),
        (False, {"ov-fp32": ("f", "fp32"), "ov-int8": ("i", "int8")}),
    ],
)
def test_bench_peer_openvino_default_precision_is_bf16_only_on_a_bf16_cpu(
    bf16_cpu: bool, expected: dict[str, tuple[str, str]]
) -> None:
    assert bench.peer.ov_runtimes({"fp32": "f", "int8": "i"}, bf16_cpu) == expected


def test_bench_peer_calibration_file_holds_real_sentences_not_the_workloads(tmp_path: Path) -> None:
    import json

    from bench.workload import request_texts

    path = bench.peer.calibration_file(tmp_path / "calibration.jsonl")
    texts = [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(texts) == bench.peer.CALIBRATION_TEXTS
    assert all(any("\u4e00" <= ch <= "\u9fff" for ch in t) for t in texts)  # Chinese sentences
    assert not set(texts) & set(request_texts(600))  # none of the texts the step measures


def test_bench_matmul_peaks_and_table() -> None:
    from bench.matmul import ops, peaks, table

    rows = [
        {"precision": "fp32", "m": 16, "k": 768, "n": 768, "ops_per_s": 1e11},
        {"precision": "fp32", "m": 1024, "k": 768, "n": 768, "ops_per_s": 2e11},
        {"precision": "int8", "m": 1024, "k": 768, "n": 768, "ops_per_s": 8e11},
    ]
    doc = {"rows": rows, "peak_ops_per_s": peaks(rows)}
    assert doc["peak_ops_per_s"] == {"fp32": 2e11, "int8": 8e11}
    assert table(doc) == [
        "| M x K x N | fp32, G ops/s | int8, G ops/s |",
        "|---|---|---|",
        "| 16 x 768 x 768 | 100 | - |",
        "| 1024 x 768 x 768 | 200 | 800 |",
        "| **peak** | **200** | **800** |",
    ]
    assert ops(1024, 768, 3072) == 2 * 1024 * 768 * 3072


def _run(engine: str, sizing: str, c: int, rps: float, errors: int = 0) -> dict[str, Any]:
    return {
        "engine": engine,
        "sizing": sizing,
        "concurrency": c,
        "requests_per_s": rps,
        "latency_ms": {"p50": 1000 / rps, "p99": 3000 / rps},
        "errors": errors,
    }


def test_bench_http_peers_choose_sizing_by_wins_then_total() -> None:
    from bench.http_peers import choose_sizing

    runs = [
        _run("tf-int8", "1x2", 1, 30.0),
        _run("tf-int8", "2x1", 1, 20.0),
        _run("ov-int8", "1x2", 1, 60.0),
        _run("ov-int8", "2x1", 1, 50.0),
        _run("tf-int8", "1x2", 16, 30.0),
        _run("tf-int8", "2x1", 16, 45.0),
    ]
    assert choose_sizing(runs) == {"sizing": "1x2", "wins": {"1x2": 2, "2x1": 1}}
    runs.append(_run("ov-int8", "1x2", 16, 40.0))
    runs.append(_run("ov-int8", "2x1", 16, 90.0))
    # 2 wins each; 2x1's total (205) is above 1x2's (160).
    assert choose_sizing(runs) == {"sizing": "2x1", "wins": {"1x2": 2, "2x1": 2}}
    assert choose_sizing([]) == {"sizing": None, "wins": {}}


def test_bench_http_peers_table_one_row_per_engine_and_sizing() -> None:
    from bench.http_peers import table

    doc = {
        "concurrency": [1, 4],
        "runs": [
            _run("tf-fp32", "1x2", 1, 10.0),
            _run("tf-fp32", "1x2", 4, 20.0, errors=2),
            _run("ov-int8", "1x2", 1, 40.0),
        ],
    }
    assert table(doc) == [
        "| engine | workers x threads | c=1: req/s, p50 / p99 ms | c=4: req/s, p50 / p99 ms | errors |",
        "|---|---|---|---|---|",
        "| tf-fp32 | 1x2 | 10.0, 100 / 300 | 20.0, 50 / 150 | 2 |",
        "| ov-int8 | 1x2 | 40.0, 25 / 75 | - | 0 |",
    ]


@pytest.mark.parametrize("bad", ["2", "0x2", "2x", "axb", "1x2x3", "-1x2"])
def test_bench_http_peers_refuses_a_bad_sizing(bad: str) -> None:
    from bench.http_peers import parse_sizing

    with pytest.raises(ValueError, match="WORKERSxTHREADS"):
        parse_sizing(bad)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--http-engines", "tf-fp32,tensorrt"], "--http-engines: unknown tensorrt"),
        (["--http-sizings", "2by1"], "WORKERSxTHREADS"),
        (["--http-concurrency", "1,x"], "--http-concurrency"),
        (["--http-concurrency", "0"], "--http-concurrency: positive integers"),
    ],
)
def test_bench_http_peers_bad_flags_are_usage_errors(
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import bench.http_peers

    monkeypatch.setattr(bench.rbt6, "build_model", lambda: {})
    monkeypatch.setattr(bench.http_peers, "run", lambda **kw: pytest.fail("must not run"))
    with pytest.raises(SystemExit) as info:
        main(["http-peers", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("module", ["bench.peer", "bench.matmul", "bench.http_peers"])
def test_bench_doctests_hold(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


def test_bench_http_peers_counts_workers_killed_by_a_signal() -> None:
    from bench.http_peers import crashed_workers

    log = (
        "INFO Booting worker with pid: 7\n"
        "WARNING gunicorn.error Worker (pid:7) was sent SIGBUS!\n"
        "free(): invalid size\n"
        "WARNING gunicorn.error Worker (pid:8) was sent SIGSEGV!\n"
        "INFO worker 9 ready: model loaded and warmed\n"
    )
    assert crashed_workers(log) == 2
    assert crashed_workers("INFO worker 9 ready: model loaded and warmed\n") == 0


def test_bench_serve_length_joins_records_and_caps_a_copy(tmp_path: Path) -> None:
    """The long texts join whole held-out records (their facts united, 90 to 200 characters); each
    length is a copy whose model.json ends its buckets at it, the committed model untouched."""
    import json

    from bench.serve_length import MODELS, long_texts, served_at
    from nlp.manifest import load_manifest

    pool = tmp_path / "heldout.jsonl"
    records = [
        {
            "text": f"第{i}句" + "字" * (20 + i),
            "triples": [[f"第{i}句", "作者", "字"]],
            "entities": [],
        }
        for i in range(12)
    ]
    pool.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    out = long_texts(pool, tmp_path / "long.jsonl", records=20, seed=1)
    docs = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(docs) == 20
    for doc in docs:
        assert 90 <= len(doc["text"]) <= 200
        assert all(t[0] in doc["text"] for t in doc["triples"]) and len(doc["triples"]) >= 2
    demo = MODELS["triples"]
    for length in (64, 128):
        manifest = load_manifest(served_at(demo, length, tmp_path))
        assert manifest.max_length == length and manifest.length_buckets[-1] == length
    assert load_manifest(demo).max_length == 96
