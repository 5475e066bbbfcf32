"""Micro precision / recall / F1 of exact triples (subject text, predicate, object text).

Scores what the server would answer: the model directory is loaded with ``nlp.pipeline.Extractor``
(same tokenizer, windows, buckets and decoding as the service). Records are JSON lines
``{"text": ..., "triples": [[subject, predicate, object], ...]}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TripleKey = tuple[str, str, str]


@dataclass(frozen=True)
class Scores:
    true_positives: int
    predicted: int
    gold: int
    records: int

    @property
    def precision(self) -> float:
        return self.true_positives / self.predicted if self.predicted else 0.0

    @property
    def recall(self) -> float:
        return self.true_positives / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "gold": self.gold,
            "predicted": self.predicted,
            "correct": self.true_positives,
            "precision": round(self.precision, 4),
            "recall": round(self.recall, 4),
            "f1": round(self.f1, 4),
        }


def score(predicted: Iterable[set[TripleKey]], gold: Iterable[set[TripleKey]]) -> Scores:
    """Micro scores over paired per-record triple sets.

    >>> score([{("a", "p", "b")}], [{("a", "p", "b"), ("a", "q", "c")}]).to_dict()["recall"]
    0.5
    """
    tp = n_pred = n_gold = n = 0
    for pred, true in zip(predicted, gold, strict=True):
        tp += len(pred & true)
        n_pred += len(pred)
        n_gold += len(true)
        n += 1
    return Scores(tp, n_pred, n_gold, n)


def read_records(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def gold_triples(record: dict[str, Any]) -> set[TripleKey]:
    return {(str(s), str(p), str(o)) for s, p, o in record.get("triples", [])}


def predict_triples(extractor: Any, texts: Sequence[str], batch: int = 64) -> list[set[TripleKey]]:
    out: list[set[TripleKey]] = []
    for k in range(0, len(texts), batch):
        for extraction in extractor.extract_batch(list(texts[k : k + batch])):
            out.append(
                {(t.subject.span.text, t.predicate, t.object.span.text) for t in extraction.triples}
            )
    return out


def evaluate(
    model_dir: str | Path, data_path: str | Path, *, precision: str = "fp32"
) -> tuple[Scores, list[dict[str, Any]]]:
    """Scores of ``model_dir`` on ``data_path``, and the records it got wrong (for inspection)."""
    from nlp.pipeline import Extractor

    records = read_records(Path(data_path))
    extractor = Extractor.load(model_dir, precision=precision)
    predicted = predict_triples(extractor, [r["text"] for r in records])
    gold = [gold_triples(r) for r in records]
    errors = [
        {
            "text": r["text"],
            "missed": sorted(g - p),
            "spurious": sorted(p - g),
        }
        for r, p, g in zip(records, predicted, gold, strict=True)
        if p != g
    ]
    return score(predicted, gold), errors
