"""Micro precision / recall / F1: exact triples for a ``triples`` model, exact entities for an
``entities`` model.

Scores what the server would answer: the model directory is loaded with ``nlp.pipeline.Extractor``
(same tokenizer, windows, buckets and decoding as the service). Records are JSON lines
``{"text": ..., "triples": [[subject, predicate, object], ...], "entities": [[name, type], ...]}``.

A triple counts when (subject text, predicate, object text) matches. An entity counts when its
character span and type match a gold entity: the gold entities of a record are every occurrence of
each named entity (``training.schema.entity_spans``; without ``entities``, the typed arguments of
its triples), so the score is entity-level, by position.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TripleKey = tuple[str, str, str]
EntityKey = tuple[int, int, str]


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


def score(predicted: Iterable[set[Any]], gold: Iterable[set[Any]]) -> Scores:
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


def gold_entities(record: dict[str, Any]) -> set[EntityKey]:
    """``(start, end, type)`` of every mention of the record's named entities.

    >>> sorted(gold_entities({"text": "张三生于北京。", "entities": [["北京", "地点"], ["张三", "人物"]]}))
    [(0, 2, '人物'), (4, 6, '地点')]
    """
    from training.schema import entity_spans, triple_entities

    named = record.get("entities")
    if named is None:
        named = triple_entities([(str(s), str(p), str(o)) for s, p, o in record.get("triples", [])])
    return set(entity_spans(record["text"], [(str(n), str(t)) for n, t in named]))


def predict_entities(extractor: Any, texts: Sequence[str], batch: int = 64) -> list[set[EntityKey]]:
    out: list[set[EntityKey]] = []
    for k in range(0, len(texts), batch):
        for extraction in extractor.extract_batch(list(texts[k : k + batch])):
            out.append({(e.span.start, e.span.end, e.type) for e in extraction.entities})
    return out


def predict_triples(extractor: Any, texts: Sequence[str], batch: int = 64) -> list[set[TripleKey]]:
    out: list[set[TripleKey]] = []
    for k in range(0, len(texts), batch):
        for extraction in extractor.extract_batch(list(texts[k : k + batch])):
            out.append(
                {(t.subject.span.text, t.predicate, t.object.span.text) for t in extraction.triples}
            )
    return out


def model_precision(model_dir: str | Path) -> str:
    """The precision a model directory runs in by default: its own (``int8`` after quantization)."""
    from nlp.manifest import load_manifest

    return load_manifest(model_dir).precision


def _predict(
    model_dir: str | Path, precision: str | None, records: Sequence[dict[str, Any]]
) -> tuple[str, list[set[Any]], list[set[Any]]]:
    """The model's task, its predictions on ``records`` and their gold for that task."""
    from nlp.pipeline import Extractor

    texts = [r["text"] for r in records]
    with Extractor.load(model_dir, precision=precision or model_precision(model_dir)) as extractor:
        task = extractor.manifest.task
        if task == "entities":
            return (
                task,
                list(predict_entities(extractor, texts)),
                [gold_entities(r) for r in records],
            )
        return task, list(predict_triples(extractor, texts)), [gold_triples(r) for r in records]


def evaluate(
    model_dir: str | Path, data_path: str | Path, *, precision: str | None = None
) -> tuple[Scores, list[dict[str, Any]]]:
    """Scores of ``model_dir`` on ``data_path``, and the records it got wrong (for inspection).

    The model's task decides what is scored: triples, or entities (errors then list
    ``[start, end, type, text]``). ``precision`` ``None``: the model's own (fp32, or int8 for a
    quantized directory).
    """
    records = read_records(Path(data_path))
    task, predicted, gold = _predict(model_dir, precision, records)

    def shown(items: set[Any], text: str) -> list[Any]:
        if task == "entities":
            return [[s, e, t, text[s:e]] for s, e, t in sorted(items)]
        return sorted(items)

    errors = [
        {
            "text": r["text"],
            "missed": shown(g - p, r["text"]),
            "spurious": shown(p - g, r["text"]),
        }
        for r, p, g in zip(records, predicted, gold, strict=True)
        if p != g
    ]
    return score(predicted, gold), errors


@dataclass(frozen=True)
class Comparison:
    """A model against a baseline on the same records (an int8 model against its fp32 parent)."""

    scores: Scores
    baseline: Scores
    identical_texts: int

    @property
    def identical_share(self) -> float:
        return self.identical_texts / self.scores.records if self.scores.records else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "records": self.scores.records,
            "model": self.scores.to_dict(),
            "baseline": self.baseline.to_dict(),
            "f1_delta": round(self.scores.f1 - self.baseline.f1, 4),
            "identical_texts": self.identical_texts,
            "identical_share": round(self.identical_share, 4),
        }


def compare(
    model_dir: str | Path,
    baseline_dir: str | Path,
    data_path: str | Path,
    *,
    precision: str | None = None,
    baseline_precision: str | None = None,
) -> Comparison:
    """Scores of both models on ``data_path``, and on how many texts their results are identical."""
    records = read_records(Path(data_path))
    _, predicted, gold = _predict(model_dir, precision, records)
    _, reference, _ = _predict(baseline_dir, baseline_precision, records)
    same = sum(p == r for p, r in zip(predicted, reference, strict=True))
    return Comparison(score(predicted, gold), score(reference, gold), same)
