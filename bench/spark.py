"""Cost per record of ``spo spark-extract --master local[N]`` against ``spo extract --workers N`` on the
same machine and input, and the RSS of one Spark Python worker holding the model.

``python -m bench.spark [--records 20000] [--cores 2] [--model-dir models/demo]``
Both runs use N processes of one TensorFlow thread each (Spark: ``local[N]``, ``spark.task.cpus=1``;
batch: ``--workers N``), so the difference is Spark's own cost. Prints one JSON document: wall seconds,
records/s, the largest Python worker RSS seen (sampled every 0.5 s), and whether the outputs agree.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
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


def make_input(path: Path, records: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as fh:
        for i in range(records):
            text = "".join(rng.choices(SENTENCES, k=rng.randint(1, 4)))
            fh.write(json.dumps({"id": i, "text": text}, ensure_ascii=False) + "\n")


def _timed(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd``, sampling the RSS of its Python descendants; wall seconds and the largest RSS."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    top = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            for child in top.children(recursive=True):
                if "python" in child.name():
                    peak = max(peak, child.memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(0.5)
    _, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[3:])} failed:\n{err.decode(errors='replace')[-3000:]}")
    return {"seconds": round(time.monotonic() - started, 1), "worker_rss_mib": peak >> 20}


def run(records: int, cores: int, model_dir: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        make_input(src, records)
        batch_out, spark_out = Path(tmp) / "batch.jsonl", Path(tmp) / "spark"
        model = str(model_dir)
        batch = _timed([*SPO, "extract", str(src), "-o", str(batch_out), "--model-dir", model,
                        "--workers", str(cores), "-q"])  # fmt: skip
        spark = _timed([*SPO, "spark-extract", str(src), str(spark_out), "--model", model,
                        "--master", f"local[{cores}]", "--conf", "spark.ui.enabled=false",
                        "-q"])  # fmt: skip
        expected = batch_out.read_bytes().splitlines()
        got = [x for p in sorted(spark_out.glob("part-*")) for x in p.read_bytes().splitlines()]
    for result in (batch, spark):
        result["records_per_second"] = round(records / result["seconds"], 1)
        result["ms_per_record"] = round(1000 * result["seconds"] / records, 2)
    return {
        "records": records,
        "cores": cores,
        "model_dir": str(model_dir),
        "spo_extract": batch,
        "spark_extract": spark,
        "spark_over_batch": round(spark["seconds"] / batch["seconds"], 2),
        "outputs_identical": got == expected,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.spark", description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "demo")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.records, args.cores, args.model_dir), indent=2))


if __name__ == "__main__":
    main()
