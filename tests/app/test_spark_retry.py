"""A record that crashes its Spark Python worker: the retried task isolates it (``app.spark.job``).

Its own module: the session needs the repository on the workers' path (the fake extractor lives in
``tests``), and one process holds one SparkContext at a time. The master is a plain ``local[2]``, which
Spark alone never retries: ``session`` makes it ``local[2,2]``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core.settings import DEFAULT_MODEL_DIR
from tests.app.test_batch_fakes import BOOM, FakeFactory

if not os.environ.get("CI"):
    pytest.importorskip(
        "pyspark", reason="the spark extra is not installed (make test installs it)"
    )
    if shutil.which("java") is None:
        pytest.skip("no Java runtime (make test / .ci/run install one)", allow_module_level=True)

from app.spark import job as spo_spark

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spo_spark.session(
        "local[2]",
        {"spark.ui.enabled": "false", "spark.executorEnv.PYTHONPATH": str(ROOT)},
    )
    yield session
    session.stop()


def test_spark_a_record_that_crashes_its_worker_is_an_error_row_not_a_failed_job(
    spark: Any,
) -> None:
    texts = [f"张三{i}在北京" for i in range(40)]
    texts[7] = f"北京{BOOM}"  # kills whichever process runs it (os._exit), every time
    texts[31] = f"{BOOM}张三"
    assert spark.sparkContext.master == "local[2,2]"
    df = spark.createDataFrame(list(enumerate(texts)), "id long, text string").repartition(2)
    out = spo_spark.extract_dataframe(df, DEFAULT_MODEL_DIR, factory=FakeFactory(die_always=True))
    rows = {r["id"]: r.asDict(recursive=True) for r in out.collect()}
    assert sorted(rows) == list(range(40))  # nothing lost, nothing twice
    for i in (7, 31):
        assert rows[i]["error"]["code"] == "internal_error"
        assert "died twice running this record alone" in rows[i]["error"]["message"]
        assert rows[i]["entities"] is None
    for i in set(rows) - {7, 31}:
        assert rows[i]["error"] is None
        found = {(e["text"], e["type"]) for e in rows[i]["entities"]}
        assert found == {("张三", "人物"), ("北京", "地点")}
