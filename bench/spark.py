"""Cost per record of ``spo spark-extract`` against ``spo extract --workers N`` on the same machine and
input, and the RSS of one Spark Python worker holding the model.

``python -m bench.spark [--records 20000] [--cores 2] [--model-dir models/demo] [--cluster]``
Both runs use N processes of one TensorFlow thread each (Spark: ``local[N]``, or with ``--cluster`` a
standalone master and one worker of N cores started here on 127.0.0.1, ``spark.task.cpus=1``; batch:
``--workers N``), so the difference is Spark's own cost. Prints one JSON document: wall seconds,
records/s, the largest Python worker RSS seen (sampled every 0.5 s), and whether the outputs agree.

``standalone_cluster`` (a context manager, also used by tests/app/test_spark_cluster.py) starts the
master and the worker from pyspark's own ``bin/spark-class`` and stops every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
SPO = [sys.executable, "-c", "from app.cli import main; main()"]
SENTENCES = [
    "李白出生于碎叶城。",
    "鲁迅原名周树人，1881年9月25日出生于浙江绍兴。",
    "《霸王别姬》是陈凯歌执导的电影，张国荣、巩俐主演。",
    "马云创办了阿里巴巴，公司总部位于杭州。",
    "周杰伦演唱了《七里香》，方文山作词。",
]


# --- a standalone cluster on 127.0.0.1 ----------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 (bound, read, released)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class Cluster:
    """A running standalone master and worker; ``url`` is the master's ``spark://`` URL."""

    url: str
    webui: str
    workdir: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    leftovers: list[str] = field(
        default_factory=list
    )  # processes alive after stop(): none expected

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.webui}/json/", timeout=5) as response:
            return dict(json.load(response))

    def python_workers(self) -> list[psutil.Process]:
        """The Python processes the cluster runs (pyspark's daemons and the workers they forked)."""
        found = []
        for proc in self._descendants():
            with contextlib.suppress(psutil.Error):
                if "python" in proc.name() or any("pyspark" in a for a in proc.cmdline()[:3]):
                    found.append(proc)
        return found

    def kill_busy_python_worker(self, min_rss: int = 400 << 20) -> int | None:
        """SIGKILL the largest forked Python worker holding at least ``min_rss``; its pid, or None."""
        workers = self.python_workers()
        pids = {p.pid for p in workers}
        forked = []
        for proc in workers:
            with contextlib.suppress(psutil.Error):
                if proc.ppid() in pids and proc.memory_info().rss >= min_rss:
                    forked.append((proc.memory_info().rss, proc))
        if not forked:
            return None
        _, victim = max(forked, key=lambda pair: pair[0])
        victim.send_signal(signal.SIGKILL)
        return int(victim.pid)

    def _descendants(self) -> list[psutil.Process]:
        found = []
        for popen in self.processes:
            with contextlib.suppress(psutil.Error):
                top = psutil.Process(popen.pid)
                found += [top, *top.children(recursive=True)]
        return found

    def stop(self) -> None:
        """Stop the worker (and its executors), then the master; kill what is left after 20 s."""
        everything = self._descendants()
        for popen in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(everything, timeout=20)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        for popen in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=10)
        _, alive = psutil.wait_procs(everything, timeout=10)
        self.leftovers = [f"{p.pid} {p.name()}" for p in alive if p.is_running()]


def _wait(what: str, ready: Any, log: Path, proc: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError, ValueError):
            if ready():
                return
        time.sleep(0.5)
    raise RuntimeError(f"{what} not ready after {seconds:.0f} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def standalone_cluster(
    workdir: Path, *, cores: int = 2, memory: str = "4g", timeout: float = 120
) -> Iterator[Cluster]:
    """A Spark standalone master and one worker (``cores``, ``memory``) on 127.0.0.1.

    Both are pyspark's own (``$SPARK_HOME/bin/spark-class``, SPARK_HOME the pyspark package), each in
    its own process group; logs, work and scratch directories are under ``workdir``. Everything is
    stopped on exit, even when the body raised; ``Cluster.leftovers`` then lists anything still alive.
    """
    home = spark_home()
    workdir.mkdir(parents=True, exist_ok=True)
    for sub in ("logs", "work", "local"):
        (workdir / sub).mkdir(exist_ok=True)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(workdir / "logs"),
        "SPARK_WORKER_DIR": str(workdir / "work"),
        "SPARK_LOCAL_DIRS": str(workdir / "local"),
        "SPARK_NO_DAEMONIZE": "1",
    }
    port, ui, worker_ui = free_ports(3)
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}", workdir)
    spark_class = str(home / "bin" / "spark-class")

    def start(name: str, args: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = workdir / "logs" / f"{name}.out"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [spark_class, *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        cluster.processes.append(proc)
        return proc, log

    try:
        master, log = start(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(ui)],
        )  # fmt: skip
        _wait("the master", lambda: cluster.status().get("status") == "ALIVE", log, master, timeout)
        worker, log = start(
            "worker",
            ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(cores),
             "--memory", memory, "--webui-port", str(worker_ui), "--work-dir",
             str(workdir / "work"), cluster.url],
        )  # fmt: skip
        _wait(
            "the worker", lambda: cluster.status().get("aliveworkers", 0) >= 1, log, worker, timeout
        )
        yield cluster
    finally:
        cluster.stop()


def make_input(path: Path, records: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as fh:
        for i in range(records):
            text = "".join(rng.choices(SENTENCES, k=rng.randint(1, 4)))
            fh.write(json.dumps({"id": i, "text": text}, ensure_ascii=False) + "\n")


def _timed(
    cmd: list[str], workers: Callable[[], list[psutil.Process]] | None = None
) -> dict[str, Any]:
    """Run ``cmd``, sampling the RSS of its Python descendants (and of ``workers()``, a cluster's
    Python workers); wall seconds and the largest RSS."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    top = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            found = top.children(recursive=True) + (workers() if workers else [])
            for child in found:
                if "python" in child.name():
                    peak = max(peak, child.memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(0.5)
    _, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[3:])} failed:\n{err.decode(errors='replace')[-3000:]}")
    return {"seconds": round(time.monotonic() - started, 1), "worker_rss_mib": peak >> 20}


def run(records: int, cores: int, model_dir: Path, cluster: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        make_input(src, records)
        batch_out, spark_out = Path(tmp) / "batch.jsonl", Path(tmp) / "spark"
        model = str(model_dir)
        batch = _timed([*SPO, "extract", str(src), "-o", str(batch_out), "--model-dir", model,
                        "--workers", str(cores), "-q"])  # fmt: skip
        spark_cmd = [*SPO, "spark-extract", str(src), str(spark_out), "--model", model,
                     "--conf", "spark.ui.enabled=false", "--conf", "spark.task.cpus=1", "-q"]  # fmt: skip
        if cluster:
            with standalone_cluster(Path(tmp) / "cluster", cores=cores) as running:
                spark_cmd += ["--master", running.url, "--ship-model", "--python", sys.executable]
                spark = _timed(spark_cmd, running.python_workers)
            if running.leftovers:
                raise SystemExit(f"the cluster left processes running: {running.leftovers}")
        else:
            spark = _timed([*spark_cmd, "--master", f"local[{cores}]"])
        expected = batch_out.read_bytes().splitlines()
        got = [x for p in sorted(spark_out.glob("part-*")) for x in p.read_bytes().splitlines()]
    for result in (batch, spark):
        result["records_per_second"] = round(records / result["seconds"], 1)
        result["ms_per_record"] = round(1000 * result["seconds"] / records, 2)
    return {
        "records": records,
        "cores": cores,
        "model_dir": str(model_dir),
        "spark_master": f"standalone (1 worker, {cores} cores)" if cluster else f"local[{cores}]",
        "cpu": _cpu(),
        "spo_extract": batch,
        "spark_extract": spark,
        "spark_over_batch": round(spark["seconds"] / batch["seconds"], 2),
        "outputs_identical": got == expected,
    }


def _cpu() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.spark", description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "demo")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="run Spark on a standalone master and worker started here, not local[N]",
    )
    args = parser.parse_args(argv)
    print(json.dumps(run(args.records, args.cores, args.model_dir, args.cluster), indent=2))


if __name__ == "__main__":
    main()
