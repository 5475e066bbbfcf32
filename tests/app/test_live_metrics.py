"""Live metrics: ``spo serve`` with 2 workers under load, scraped through ``GET /metrics``.

The counters every worker wrote add up to the requests sent (workers that were recycled meanwhile
included), and the session graph's op count is the same before and after 1,000 mixed-length requests.
The metrics directory the master made outlives the recycled workers and goes when the master exits.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.core.rundirs import OWNER_FILE
from tests.app.test_live import (
    call,
    free_port,
    post_json,
    start_serve,
    stop,
    wait_ready,
    wait_workers,
)
from tests.app.test_rundirs import dead_pid

pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.timeout(900)]

REQUESTS = 1000
MAX_REQUESTS = 400  # each worker is recycled once or so during the load
METRICS_TOKEN = "metrics-token-0123456789"
CHARS = "李白出生于碎叶城杜甫妻子北京大学作者红楼梦曹雪芹，。！？"


@dataclass
class Server:
    port: int
    log: Path
    metrics_dir: Path


@pytest.fixture(scope="module")
def server(triples_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    run_dir = tmp_path_factory.mktemp("live-metrics")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SPO_", "PROMETHEUS_"))},
        "SPO_MODEL_DIR": str(triples_model_dir),
        "SPO_WORKERS": "2",
        "SPO_THREADS": "4",
        "SPO_MAX_REQUESTS": str(MAX_REQUESTS),
        "SPO_MAX_REQUESTS_JITTER": "50",
        "SPO_TIMEOUT": "120",
        "SPO_METRICS_TOKEN": METRICS_TOKEN,
        "SPO_AUTH_TOKENS": "api-token-0123456789abc",
        "SPO_LOG_FORMAT": "json",
        "TMPDIR": str(run_dir),  # where the master makes its metrics directory
    }
    log = run_dir / "gunicorn.log"
    # What a master killed with SIGKILL left: the next start removes it.
    killed = run_dir / "spo-metrics-killed"
    killed.mkdir()
    (killed / OWNER_FILE).write_text(f"{dead_pid()}\n", encoding="ascii")
    process = start_serve(port, env, log)
    try:
        wait_ready(port, process, log, 120)
        wait_workers(log, 2, 120)
        (metrics_dir,) = run_dir.glob("spo-metrics-*")
        assert metrics_dir != killed
        yield Server(port, log, metrics_dir)
        # Still there after the recycled workers exited; gone once the master did.
        assert metrics_dir.is_dir()
    finally:
        stop(process)
    assert not metrics_dir.exists(), "the master left its metrics directory behind"


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by name: ``[(labels, value), ...]``."""
    answer = call(port, "GET", "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert answer.status == 200, answer.body[:300]
    assert answer.headers["content-type"].startswith("text/plain")
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(answer.body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def total(
    samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str
) -> float:
    return sum(
        value
        for got, value in samples.get(name, [])
        if all(got.get(k) == v for k, v in labels.items())
    )


def mixed_texts(n: int, seed: int = 7) -> list[list[str]]:
    """Request bodies of 1-3 texts from 1 to 150 characters (over the tiny model's 64 tokens too)."""
    rng = random.Random(seed)
    return [
        ["".join(rng.choices(CHARS, k=rng.randint(1, 150))) for _ in range(rng.randint(1, 3))]
        for _ in range(n)
    ]


def test_live_metrics_add_up_across_workers_and_op_count_stays(server: Server) -> None:
    port = server.port
    auth = {"Authorization": "Bearer api-token-0123456789abc"}
    # /metrics has its own token: none, or an API token, is refused.
    assert call(port, "GET", "/metrics").status == 401
    assert call(port, "GET", "/metrics", headers=auth).status == 401

    # Warm every worker's gauges (a worker refreshes them as it serves), then take the baseline.
    for _ in range(8):
        assert post_json(port, {"text": "李白出生于碎叶城。"}, **auth).status == 200
    before = scrape(port)
    ops_before = {labels["pid"]: v for labels, v in before["spo_model_graph_ops"]}
    assert len(ops_before) == 2 and len(set(ops_before.values())) == 1, ops_before
    op_count = next(iter(ops_before.values()))
    assert op_count > 100
    sent_before = total(before, "spo_http_requests_total", endpoint="/v1/extract")

    bodies = mixed_texts(REQUESTS)
    with ThreadPoolExecutor(8) as pool:
        statuses = list(
            pool.map(lambda texts: post_json(port, {"texts": texts}, **auth).status, bodies)
        )
    assert statuses.count(200) == REQUESTS
    # A refused request is counted too, by its problem code.
    assert post_json(port, {"text": "a" * 10_001}, **auth).status == 422

    after = scrape(port)
    # Every worker's counts, recycled workers' included, add up to what was sent.
    assert total(after, "spo_http_requests_total", endpoint="/v1/extract", status="200") == (
        sent_before + REQUESTS
    )
    assert total(after, "spo_http_refusals_total", code="text_too_long") == 1
    texts_sent = sum(len(b) for b in bodies)
    assert (
        total(after, "spo_request_texts_sum") - total(before, "spo_request_texts_sum") == texts_sent
    )
    assert (
        total(after, "spo_request_texts_count") - total(before, "spo_request_texts_count")
        == REQUESTS
    )
    assert (
        total(after, "spo_model_calls_total") >= total(before, "spo_model_calls_total") + REQUESTS
    )
    lengths = {labels["length"] for labels, _ in after["spo_model_calls_total"]}
    assert {"16", "64"} <= lengths  # short and long texts ran in their own buckets
    assert total(after, "spo_model_padding_tokens_total") > 0
    assert total(after, "spo_worker_recycles_total", reason="max_requests") >= 1
    # The recycled workers' counters live on in one merged file per type, not in files of their
    # own: the directory holds the merged files and the files of the workers running now.
    kept = {p.name for p in server.metrics_dir.glob("*.db")}
    assert {"counter_merged.db", "histogram_merged.db"} <= kept, kept
    owners = {name.rsplit("_", 1)[1][:-3] for name in kept} - {"merged"}
    assert all(Path("/proc", pid).exists() for pid in owners), kept
    assert len(owners) <= 3, kept  # 2 workers, and one exiting now and then

    # The op count of every live worker is the one before the load: nothing added nodes.
    for _ in range(8):  # let each live worker refresh its gauges
        post_json(port, {"text": "北京"}, **auth)
    ops_after = {labels["pid"]: v for labels, v in scrape(port)["spo_model_graph_ops"]}
    assert len(ops_after) == 2, ops_after  # dead workers' gauges are gone
    assert set(ops_after.values()) == {op_count}
    info = after["spo_model_info"]
    assert [(labels["model"], value) for labels, value in info] == [("tiny-triples", 1.0)]
    assert all(v > 0 for _, v in after["spo_worker_rss_bytes"])


def test_live_metrics_a_check_or_a_refused_start_leaves_a_running_servers_metrics(
    triples_model_dir: Path, tmp_path: Path
) -> None:
    """With PROMETHEUS_MULTIPROC_DIR given (the pod's emptyDir), ``spo serve --check-config`` in the
    pod, or a second ``spo serve`` that is refused, emptied the directory of the running workers'
    files: their counts vanished from /metrics, and the check left a gauge of its own pid."""
    import subprocess
    import sys

    metrics_dir = tmp_path / "metrics"
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SPO_", "PROMETHEUS_"))},
        "SPO_MODEL_DIR": str(triples_model_dir),
        "SPO_WORKERS": "1",
        "SPO_METRICS_TOKEN": METRICS_TOKEN,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "TMPDIR": str(tmp_path),
    }
    log = tmp_path / "gunicorn.log"
    process = start_serve(port, env, log)
    spo = str(Path(sys.executable).with_name("spo"))
    try:
        wait_ready(port, process, log, 120)
        for _ in range(5):
            assert post_json(port, {"text": "李白出生于碎叶城。"}).status == 200
        sent = total(scrape(port), "spo_http_requests_total", endpoint="/v1/extract")
        assert sent == 5
        files = sorted(p.name for p in metrics_dir.glob("*.db"))
        check = subprocess.run(
            [spo, "serve", "--bind", f"127.0.0.1:{port}", "--check-config"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert check.returncode == 0, check.stderr[-2000:]
        second = subprocess.run(
            [spo, "serve", "--bind", f"127.0.0.1:{port}"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert second.returncode != 0
        assert sorted(p.name for p in metrics_dir.glob("*.db")) == files
        assert post_json(port, {"text": "李白出生于碎叶城。"}).status == 200
        after = scrape(port)
        assert total(after, "spo_http_requests_total", endpoint="/v1/extract") == sent + 1
        pids = {labels["pid"] for labels, _ in after["spo_worker_rss_bytes"]}
        assert len(pids) == 1 and all(Path("/proc", pid).exists() for pid in pids), pids
    finally:
        stop(process)
