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
