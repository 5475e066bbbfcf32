"""``app.web.metrics`` in-process: ``/metrics`` and its token, request and model-call metrics, the batch
textfile. The multiprocess (gunicorn) side is covered live by ``test_live_metrics.py``."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from app.batch.runner import BatchSummary
from app.batch.textfile import write_batch_textfile
from app.core.settings import Settings, SettingsError
from app.web.metrics import MERGE_LOCK, fold_dead_workers, prepare_multiprocess_dir

METRICS_TOKEN = "metrics-token-0123456789"
API_TOKEN = "api-token-0123456789abcdef"


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(
        v for got, v in found.get(name, []) if all(got.get(k) == w for k, w in labels.items())
    )


def scrape(client: FlaskClient, **headers: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    answer = client.get("/metrics", headers=headers)
    assert answer.status_code == 200
    assert answer.mimetype == "text/plain"
    return samples(answer.get_data(as_text=True))


def test_metrics_count_requests_model_calls_and_refusals(client: FlaskClient) -> None:
    assert (
        client.post("/v1/extract", json={"texts": ["李白出生于碎叶城。", "北京"]}).status_code
        == 200
    )
    assert client.post("/v1/extract", json={"text": "a" * 301}).status_code == 422
    assert client.post("/v1/extract", json={"texts": []}).status_code == 422
    found = scrape(client)
    assert value(found, "spo_http_requests_total", endpoint="/v1/extract", status="200") == 1
    assert value(found, "spo_http_requests_total", endpoint="/v1/extract", status="422") == 2
    assert value(found, "spo_http_refusals_total", code="text_too_long", status="422") == 1
    assert value(found, "spo_http_refusals_total", code="empty_texts") == 1
    assert value(found, "spo_http_request_duration_seconds_count", endpoint="/v1/extract") == 3
    # Only the request that ran counts its texts and tokens.
    assert value(found, "spo_request_texts_count") == 1
    assert value(found, "spo_request_texts_sum") == 2
    assert value(found, "spo_request_tokens_sum") == len("李白出生于碎叶城。") + len("北京")
    calls = found["spo_model_calls_total"]
    assert sum(v for _, v in calls) >= 1
    assert all(labels["model"] == "tiny-triples" for labels, _ in calls)
    # Padding: every call's batch x length positions are real tokens or pads.
    positions = sum(int(labels["batch"]) * int(labels["length"]) * v for labels, v in calls)
    real = value(found, "spo_model_tokens_total")
    assert real == len("李白出生于碎叶城。") + len("北京") + 4  # [CLS] and [SEP] per text
    assert value(found, "spo_model_padding_tokens_total") == positions - real
    assert value(found, "spo_model_call_seconds_count") == sum(v for _, v in calls)


def test_metrics_describe_the_worker_and_model(client: FlaskClient, triples_extractor: Any) -> None:
    found = scrape(client)
    [(labels, one)] = found["spo_model_info"]
    assert one == 1
    assert labels == {
        "model": "tiny-triples",
        "version": "7",
        "task": "triples",
        "precision": "fp32",
    }
    assert value(found, "spo_model_graph_ops") == triples_extractor.runtime.graph_op_count > 100
    assert value(found, "spo_worker_rss_bytes") > 10 << 20
    assert value(found, "spo_model_load_seconds", phase="load") > 0
    assert value(found, "spo_model_load_seconds", phase="warmup") > 0


def test_metrics_describe_the_worker_before_its_first_request(app: Flask) -> None:
    """Under gunicorn a scrape reads every worker's files: one that has answered nothing yet shows
    its RSS and its model from the moment the model is ready, not 0 and nothing."""
    from prometheus_client import generate_latest

    found = samples(generate_latest(app.extensions["spo.metrics"].registry).decode())
    assert value(found, "spo_worker_rss_bytes") > 10 << 20
    assert value(found, "spo_model_info", model="tiny-triples") == 1
    assert value(found, "spo_model_load_seconds", phase="warmup") > 0


def test_metrics_graph_op_count_is_read_without_adding_nodes(
    client: FlaskClient, triples_extractor: Any
) -> None:
    before = triples_extractor.runtime.graph_op_count
    for _ in range(3):
        client.post("/v1/extract", json={"text": "李白" * 40})
        scrape(client)
    assert value(scrape(client), "spo_model_graph_ops") == before
    assert triples_extractor.runtime.graph_op_count == before


def test_metrics_token_guards_metrics_and_only_metrics(
    make_fake_app: Callable[..., Flask],
) -> None:
    client = make_fake_app(metrics_token=METRICS_TOKEN, auth_tokens=(API_TOKEN,)).test_client()
    assert client.get("/metrics").status_code == 401
    refused = client.get("/metrics", headers={"Authorization": f"Bearer {API_TOKEN}"})
    assert refused.status_code == 401
    assert refused.json["code"] == "unauthorized"
    assert (
        client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).status_code
        == 200
    )
    # The metrics token opens nothing else.
    other = client.post(
        "/v1/extract", json={"text": "北京"}, headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    )
    assert other.status_code == 401


def test_metrics_open_without_metrics_token_even_with_api_tokens(
    make_fake_app: Callable[..., Flask],
) -> None:
    client = make_fake_app(auth_tokens=(API_TOKEN,)).test_client()
    assert client.get("/metrics").status_code == 200


def test_metrics_count_microbatch_sizes(make_fake_app: Callable[..., Flask]) -> None:
    app = make_fake_app(microbatch_wait_ms=1, threads=4)
    client = app.test_client()
    assert client.post("/v1/extract", json={"texts": ["北京", "上海"]}).status_code == 200
    found = scrape(client)
    assert value(found, "spo_microbatch_requests_count") == 1
    assert value(found, "spo_request_texts_sum") == 2


def test_metrics_labels_stay_bounded_whatever_the_method(client: FlaskClient) -> None:
    """A client may send any method token: each one was a new series (in every worker's file and in
    Prometheus), so a loop of made-up methods grew them without end. Unknown methods are "other"."""
    for i in range(30):
        client.open("/v1/extract", method=f"XQ{i:03d}")
    client.open("/v1/extract", method="PUT")
    found = scrape(client)
    methods = {labels["method"] for labels, _ in found["spo_http_requests_total"]}
    assert "XQ000" not in methods and {"other", "PUT"} <= methods
    assert value(found, "spo_http_requests_total", method="other", status="405") == 30


def test_metrics_prepare_multiprocess_dir_starts_empty(tmp_path: Path) -> None:
    directory = tmp_path / "m"
    directory.mkdir()
    (directory / "counter_123.db").write_bytes(b"stale")
    (directory / "keep.txt").write_text("not ours")
    assert prepare_multiprocess_dir(directory) == directory
    assert sorted(p.name for p in directory.iterdir()) == ["keep.txt"]
    assert prepare_multiprocess_dir(tmp_path / "new" / "dir").is_dir()


_WORKER = """
import sys
from prometheus_client import Counter, Histogram
requests = Counter("spo_http_requests", "doc", ["status"])
latency = Histogram("spo_http_request_duration_seconds", "doc", buckets=(0.1, 1))
for i in range(int(sys.argv[1])):
    requests.labels("200" if i % 3 else "429").inc()
    latency.observe(0.05 * i)
print(__import__("os").getpid())
"""


def _worker(directory: Path, requests: int) -> int:
    """A process that writes a counter and a histogram into ``directory``, as a worker does; its pid."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, str(requests)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def _collect(directory: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    return samples(generate_latest(registry).decode())


def test_metrics_dead_workers_are_folded_and_their_sums_kept(tmp_path: Path) -> None:
    """Each recycled worker left a counter and a histogram file for as long as the server ran (the
    directory grew without end); folded into one merged file per type, every sum stays the same."""
    directory = prepare_multiprocess_dir(tmp_path / "m")
    dead = [_worker(directory, n) for n in (5, 7, 11)]
    live = _worker(directory, 4)  # stands for a worker still running: its files stay its own
    before = _collect(directory)
    assert value(before, "spo_http_requests_total") == 27
    assert fold_dead_workers(directory, live={live}) == 6
    names = sorted(p.name for p in directory.glob("*.db"))
    assert names == sorted(
        ["counter_merged.db", "histogram_merged.db", f"counter_{live}.db", f"histogram_{live}.db"]
    )
    assert _collect(directory) == before
    # Later exits fold into the same files; the totals go on adding up.
    more = [_worker(directory, 2) for _ in range(2)]
    assert fold_dead_workers(directory, live={live, *more}) == 0
    assert fold_dead_workers(directory, live={live}) == 4
    after = _collect(directory)
    assert value(after, "spo_http_requests_total") == 31
    assert value(after, "spo_http_requests_total", status="429") == 2 + 3 + 4 + 2 + 1 + 1
    assert value(after, "spo_http_request_duration_seconds_count") == 31
    assert len(list(directory.glob("*.db"))) == 4 and dead


def test_metrics_fold_waits_for_no_scrape(tmp_path: Path) -> None:
    """A scrape in progress holds the lock shared: the fold leaves the files for the next exit
    rather than change them under the scrape (which could count a worker twice, or not at all)."""
    directory = prepare_multiprocess_dir(tmp_path / "m")
    _worker(directory, 3)
    files = sorted(p.name for p in directory.glob("*.db"))
    with (directory / MERGE_LOCK).open("a") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        assert fold_dead_workers(directory, live=()) == 0
    assert sorted(p.name for p in directory.glob("*.db")) == files
    assert fold_dead_workers(directory, live=()) == 2
    assert value(_collect(directory), "spo_http_requests_total") == 3


def test_metrics_batch_textfile(tmp_path: Path) -> None:
    path = tmp_path / "spo.prom"
    summary = BatchSummary(records=120, errors=3, seconds=4.0, load_seconds=2.5, recycled=1)
    write_batch_textfile(path, summary)
    found = samples(path.read_text())
    assert value(found, "spo_batch_records") == 120
    assert value(found, "spo_batch_errors") == 3
    assert value(found, "spo_batch_texts_per_second") == 30.0
    assert value(found, "spo_batch_worker_recycles") == 1
    assert value(found, "spo_batch_last_run_timestamp_seconds") > 1.7e9
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically, nothing left behind


@pytest.mark.parametrize("header", ["", "Bearer", "Basic bWV0cmljcw==", f"Bearer {METRICS_TOKEN}x"])
def test_metrics_token_refuses_wrong_credentials(
    make_fake_app: Callable[..., Flask], header: str
) -> None:
    client = make_fake_app(metrics_token=METRICS_TOKEN).test_client()
    assert client.get("/metrics", headers={"Authorization": header}).status_code == 401


def test_metrics_token_setting_is_checked(triples_model_dir: Path) -> None:
    env = {"SPO_MODEL_DIR": str(triples_model_dir), "SPO_METRICS_TOKEN": METRICS_TOKEN}
    assert Settings.from_env(env).metrics_token == METRICS_TOKEN
    with pytest.raises(SettingsError, match="SPO_METRICS_TOKEN"):
        Settings.from_env({**env, "SPO_METRICS_TOKEN": "short"})
