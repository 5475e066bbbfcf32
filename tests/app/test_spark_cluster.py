"""``spo spark-extract`` on a real Spark standalone cluster (issue 22): a master and a worker of two
cores started on 127.0.0.1 from pyspark's own ``bin/spark-class``, stopped at the end with nothing
left running, even when a test fails.

- ``spo spark-extract --master spark://... --ship-model`` (the model as an archive, the executors'
  Python named with ``--python``), with one Python worker killed in the middle of the job: the output
  still equals ``spo extract``'s, record for record, malformed lines included, every record once.
- docs/spark.md's standalone recipe (``venv-pack`` environment, ``spark-submit`` of
  ``deploy/spark_extract.py``), run word for word but for its paths: the same output.
- executors without spo: one probe task fails fast with the fix in the message.

Slow (a few minutes: most of it building and packing the recipe's environment); ``make test`` runs it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

if not os.environ.get("CI"):
    pytest.importorskip(
        "pyspark", reason="the spark extra is not installed (make test installs it)"
    )
    if shutil.which("java") is None:
        pytest.skip("no Java runtime (make test / .ci/run install one)", allow_module_level=True)

from app.batch import BatchOptions, run_batch
from app.core.settings import DEFAULT_MODEL_DIR
from bench.spark import Cluster, spark_home, standalone_cluster
from tests.app.test_spark import corpus_lines, part_lines

pytestmark = [pytest.mark.deploy, pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOCS = ROOT / "docs" / "spark.md"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with standalone_cluster(tmp_path_factory.mktemp("cluster"), cores=2, memory="4g") as running:
        yield running
    assert running.leftovers == [], f"still running after the cluster stopped: {running.leftovers}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    """1,200 JSON lines with every kind of malformed line, and ``spo extract``'s output for them."""
    tmp = tmp_path_factory.mktemp("cluster-corpus")
    path = tmp / "corpus.jsonl"
    path.write_bytes(b"\n".join(corpus_lines(1200)) + b"\n")
    out = tmp / "spo-extract.jsonl"  # the default limits: the recipe sets none
    run_batch(
        BatchOptions(inputs=(str(path),), output=str(out), model_dir=DEFAULT_MODEL_DIR, workers=0)
    )
    return path, out.read_bytes().splitlines()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


def _assert_same(out: Path, expected: list[bytes]) -> None:
    got = part_lines(out)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g == e  # byte-identical, in input order: every record exactly once
    codes = {json.loads(e)["error"]["code"] for e in expected if b'"error":{"code"' in e}
    assert codes == {"invalid_json", "invalid_input", "text_too_long"}  # malformed lines included


def test_spark_cluster_spark_extract_ship_model_survives_a_killed_worker(
    cluster: Cluster, corpus: tuple[Path, list[bytes]], tmp_path: Path
) -> None:
    path, expected = corpus
    out = tmp_path / "out"
    cmd = [str(BIN / "spo"), "spark-extract", str(path), str(out), "--master", cluster.url,
           "--ship-model", "--python", sys.executable, "--partitions", "4",
           "--conf", "spark.ui.enabled=false"]  # fmt: skip
    log = tmp_path / "driver.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=err, stderr=subprocess.STDOUT)
        killed = None
        try:
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                if killed is None:
                    killed = cluster.kill_busy_python_worker()
                time.sleep(0.2)
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    driver = log.read_text(errors="replace")
    assert proc.returncode == 0, driver[-4000:]
    assert killed is not None, "no Python worker was seen holding the model while the job ran"
    assert "Lost task" in driver  # the killed worker's task failed and was run again
    assert f"{len(expected)} records" in driver
    _assert_same(out, expected)


def _recipe() -> str:
    """docs/spark.md's standalone recipe, as the shell script it is."""
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(r"<!-- recipe:standalone -->\n```sh\n(.*?)```", text, re.S)
    assert block is not None, "docs/spark.md has no standalone recipe"
    return block.group(1)


def test_spark_cluster_docs_recipe_runs_as_written(
    cluster: Cluster, corpus: tuple[Path, list[bytes]], tmp_path: Path
) -> None:
    path, expected = corpus
    paths = {  # the recipe's paths, and only those, are this test's
        "spo-env": str(tmp_path / "spo-env"),
        "/opt/spark": str(spark_home()),
        "spark://HOST:7077": cluster.url,
        "corpus.jsonl": str(path),
        "out/": str(tmp_path / "out"),
    }
    script = _recipe()
    assert "python3.11 -m venv spo-env" in script and "deploy/spark_extract.py" in script
    for old, new in paths.items():
        assert old in script
        script = script.replace(old, new)
    env = {**_env(), "PS4": "+ [${SECONDS} s] "}  # each command with the time it started
    done = subprocess.run(
        ["bash", "-euxo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=1700,
    )
    output = done.stdout.decode(errors="replace")
    print("\n".join(line for line in output.splitlines() if line.startswith("+ [")))
    assert done.returncode == 0, output[-5000:]
    archive = tmp_path / "spo-env.tar.gz"
    print(f"packed environment: {archive.stat().st_size / (1 << 20):.0f} MiB")
    assert f"{len(expected)} records" in output  # spark-submit sends the driver's stderr to stdout
    _assert_same(tmp_path / "out", expected)


def test_spark_cluster_probe_names_the_fix_when_executors_lack_spo(
    cluster: Cluster, tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_text("李白出生于碎叶城。\n", encoding="utf-8")
    bare = Path(sys.base_prefix, "bin", "python3.11")  # the venv's base interpreter: no spo, no TF
    done = subprocess.run(
        [str(BIN / "spo"), "spark-extract", "in.txt", "out", "--master", cluster.url,
         "--python", str(bare), "--conf", "spark.ui.enabled=false"],
        cwd=tmp_path, env=_env(), capture_output=True, timeout=300,
    )  # fmt: skip
    output = done.stderr.decode(errors="replace")
    assert done.returncode == 1, output[-3000:]
    assert "executors cannot" in output and "--python-env" in output, output[-3000:]
    assert "No module named 'app'" in output
    assert "Lost task" not in output  # one probe that reports, not a job of failing tasks
    assert not (tmp_path / "out").exists()
