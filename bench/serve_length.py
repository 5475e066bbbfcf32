"""The ``max_length`` to serve a trained model with (``spo train --serve-length``), by measurement.

``python -m bench.serve_length [--lengths 64 96 128] [--records 400] [--seed 7]``

A model reads best the positions its corpus filled: 99% of the demo corpus's texts fit in 94 tokens,
so one window of 128 asks the demo models about positions they rarely saw. Long texts show it: 2 to 5
records of the held-out set (as ``make demo-model`` makes it: ``spo make-corpus --n 1000 --seed 2
--split heldout``), joined into one text of 90 to 200 characters, their facts united, drawn with
``--seed``. Each demo model (``models/demo``, triples; ``models/ner``, entities) is copied once per
length with ``max_length`` and ``length_buckets`` capped at it, and scored (``training.evaluate``) on
the long texts and on the held-out set itself. Writes ``bench/results/serve_length.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.common import PROJECT_ROOT, write_result
from bench.precision import _heldout

logger = logging.getLogger(__name__)

MODELS = {"triples": PROJECT_ROOT / "models" / "demo", "entities": PROJECT_ROOT / "models" / "ner"}


def long_texts(heldout: Path, out: Path, *, records: int, seed: int) -> Path:
    """``records`` texts of 2 to 5 held-out records each, 90 to 200 characters, facts united."""
    pool = [json.loads(line) for line in heldout.read_text(encoding="utf-8").splitlines()]
    rng = random.Random(seed)
    with out.open("w", encoding="utf-8") as fh:
        written = 0
        while written < records:
            group = rng.sample(pool, rng.randint(2, 5))
            text = "".join(r["text"] for r in group)
            if not 90 <= len(text) <= 200:
                continue
            doc = {
                "text": text,
                "triples": [t for r in group for t in r["triples"]],
                "entities": [e for r in group for e in r["entities"]],
            }
            fh.write(json.dumps(doc, ensure_ascii=False) + "\n")
            written += 1
    return out


def served_at(model: Path, length: int, into: Path) -> Path:
    """A copy of ``model`` whose ``model.json`` says ``max_length`` ``length``."""
    copy = into / f"{model.name}-{length}"
    shutil.copytree(model, copy)
    manifest = json.loads((copy / "model.json").read_text(encoding="utf-8"))
    manifest["max_length"] = length
    manifest["length_buckets"] = [b for b in manifest["length_buckets"] if b < length] + [length]
    (copy / "model.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=2) + "\n")
    return copy


def run(*, lengths: list[int], records: int = 400, seed: int = 7) -> dict[str, Any]:
    from training.evaluate import evaluate

    heldout = Path(_heldout())
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="spo-serve-length-") as tmp:
        work = Path(tmp)
        sets = {
            "long": long_texts(heldout, work / "long.jsonl", records=records, seed=seed),
            "heldout": heldout,
        }
        for task, model in MODELS.items():
            for length in lengths:
                served = served_at(model, length, work)
                for name, path in sets.items():
                    report, _ = evaluate(served, path)
                    row = {k: v for k, v in report.to_dict().items() if not k.startswith("by_")}
                    rows.setdefault(task, {}).setdefault(name, {})[str(length)] = row
                    logger.info("%s at %d on %s: F1 %.4f", task, length, name, report.f1)
    doc = {"lengths": lengths, "records": records, "seed": seed, "scores": rows}
    write_result("serve_length", doc)
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 96, 128])
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    doc = run(lengths=args.lengths, records=args.records, seed=args.seed)
    for task, sets in doc["scores"].items():
        for name, by_length in sets.items():
            cells = ", ".join(f"{n}: F1 {r['f1']:.4f}" for n, r in by_length.items())
            print(f"{task} {name}: {cells}")


if __name__ == "__main__":
    main()
