"""Micro precision / recall / F1: exact triples for a ``triples`` model, exact entities for an
``entities`` model.

Scores what the server would answer: the model directory is loaded with ``nlp.pipeline.Extractor``
(same tokenizer, windows, buckets and decoding as the service). Records are JSON lines
``{"text": ..., "triples": [[subject, predicate, object], ...], "entities": [[name, type], ...]}``.

A triple counts when (subject text, predicate, object text) matches. An entity counts when its
character span and type match a gold entity: the gold entities of a record are every occurrence of
each named entity (``training.schema.entity_spans``; without ``entities``, the typed arguments of
its triples), so the score is entity-level, by position.

Besides the micro scores of the whole set, the same scores per label (predicate, or entity type)
and, when records carry ``"patterns": [...]`` (how the sentence states its facts, ``PATTERNS``),
per pattern: a pattern's scores count every triple of the records tagged with it.
"""

from __future__ import annotations

import codecs
import json
import logging
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from nlp.tasks import Task

TripleKey = tuple[str, str, str]
EntityKey = tuple[int, int, str]

# How a sentence states its facts: the tags of the hand-written everyday set
# (tests/training/data/everyday_unseen.jsonl, described in tests/training/data/README.md). A record
# may carry several. Scoring accepts any tag; the set's test keeps its tags to these.
PATTERNS: dict[str, str] = {
    "plain": "the facts in their most common phrasing (X出生于Y, X的首都是Y, X成立于Y)",
    "passive": "the work or company first, the person after it: 被, 为…所, 所著, 是…写的",
    "you_by": "由…: 由Y执导, 由Y作词, 由Y出版, 由Y创立",
    "verb_variant": "a less common verb or noun for the predicate: 创办于, 执掌, 操刀, 填词, 老公, 校友",
    "apposition": "a name next to a noun that describes it: 作家X, 导演Y, 埃及首都开罗, X，男，汉族",
    "side_clause": "the fact inside a modifier, a subordinate clause or parentheses (由Y创办的X宣布…)",
    "multi_fact": "two or more facts in one sentence",
    "coordination": "two subjects or objects joined by 和, 与, 跟, 及 or juxtaposed",
    "list": "three or more names in a row, with 、 and 和 (the first is as much a fact as the last)",
    "number_date": "dates in everyday forms (98年, 一九五二年, 1985.07, 3月8日) or numbers near the facts",
    "coreference": "a fact stated through 他, 她, 该片, 这家公司, 本人: the gold names the antecedent",
    "negation": "a denied or corrected fact (不是A而是B, 以为A其实B): only the true one is gold",
    "near_miss": "a role or relation close to a predicate but outside the schema (译者, 制片人, 前妻)",
    "key_value": "form or résumé style fields (姓名：… 民族：… 籍贯：…)",
    "foreign_name": "a transliterated foreign name (阿尔伯特·爱因斯坦)",
    "chat": "colloquial or chat register (我爸, 老公, 咱们, 太戳心了)",
    "no_fact": "no fact of the schema although names, places or dates occur",
}

logger = logging.getLogger(__name__)


class DataError(ValueError):
    """A records file that cannot be scored (the message names the file and the line)."""


class MismatchError(ValueError):
    """Two models that cannot be compared on one file (``compare``): they answer different tasks."""


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


@dataclass(frozen=True)
class Report(Scores):
    """The scores of a whole set (it is their ``Scores``), and the same per label and per pattern.

    ``label`` names what ``by_label`` is keyed by: ``predicate`` for a triples model, ``type`` for
    an entities model. ``by_pattern`` is empty when no record carries patterns.
    """

    label: str = "predicate"
    by_label: Mapping[str, Scores] = field(default_factory=dict)
    by_pattern: Mapping[str, Scores] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out[f"by_{self.label}"] = {k: v.to_dict() for k, v in self.by_label.items()}
        if self.by_pattern:
            out["by_pattern"] = {k: v.to_dict() for k, v in self.by_pattern.items()}
        return out

    def to_text(self, title: str = "") -> str:
        """Aligned tables (Chinese labels count two columns): the whole set, per label, per pattern."""
        sections: list[tuple[str, Mapping[str, Scores]]] = [("all", {"all": self})]
        sections.append((self.label, self.by_label))
        if self.by_pattern:
            sections.append(("pattern", self.by_pattern))
        names = [k for _, rows in sections for k in rows] + [t for t, _ in sections]
        width = max(_display_width(n) for n in names) + 2
        lines = [title] if title else []
        for heading, rows in sections:
            if heading != "all":
                lines.append("")
            lines.append(_pad(heading if heading != "all" else "", width) + _TEXT_HEADER)
            for name, s in rows.items():
                lines.append(
                    _pad(name, width)
                    + f"{s.records:>8}{s.gold:>6}{s.predicted:>11}{s.true_positives:>9}"
                    + f"{s.precision:>11.3f}{s.recall:>8.3f}{s.f1:>7.3f}"
                )
        return "\n".join(lines)


_TEXT_HEADER = f"{'records':>8}{'gold':>6}{'predicted':>11}{'correct':>9}{'precision':>11}{'recall':>8}{'F1':>7}"


def _display_width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int) -> str:
    return text + " " * (width - _display_width(text))


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


def score_by_label(
    predicted: Sequence[set[Any]],
    gold: Sequence[set[Any]],
    label: Callable[[Any], str],
    order: Sequence[str] = (),
) -> dict[str, Scores]:
    """Micro scores of each label (``label(item)``: a triple's predicate, an entity's type) that
    occurs in the gold or the predictions; ``records``: the records where it occurs. Labels in
    ``order`` first, in that order, then the others sorted.

    >>> by = score_by_label([{("a", "p", "b")}], [{("a", "p", "b"), ("a", "q", "c")}], lambda t: t[1])
    >>> {k: (v.precision, v.recall) for k, v in by.items()}
    {'p': (1.0, 1.0), 'q': (0.0, 0.0)}
    """
    tp: Counter[str] = Counter()
    n_pred: Counter[str] = Counter()
    n_gold: Counter[str] = Counter()
    n: Counter[str] = Counter()
    for pred, true in zip(predicted, gold, strict=True):
        tp.update(label(x) for x in pred & true)
        n_pred.update(label(x) for x in pred)
        n_gold.update(label(x) for x in true)
        n.update({label(x) for x in pred | true})
    ranks = {name: i for i, name in enumerate(order)}
    labels = sorted(n, key=lambda k: (ranks.get(k, len(ranks)), k))
    return {k: Scores(tp[k], n_pred[k], n_gold[k], n[k]) for k in labels}


def score_by_pattern(
    patterns: Sequence[Sequence[str]], predicted: Sequence[set[Any]], gold: Sequence[set[Any]]
) -> dict[str, Scores]:
    """Micro scores of the records tagged with each pattern (``patterns[i]``: record i's tags).
    Patterns of ``PATTERNS`` first, in its order, then the others sorted.

    >>> by = score_by_pattern([["passive"], []], [{1}, {2}], [{1}, {3}])
    >>> {k: (v.records, v.f1) for k, v in by.items()}
    {'passive': (1, 1.0)}
    """
    tagged: dict[str, list[int]] = {}
    for i, tags in enumerate(patterns):
        for tag in dict.fromkeys(tags):
            tagged.setdefault(tag, []).append(i)
    ranks = {name: i for i, name in enumerate(PATTERNS)}
    names = sorted(tagged, key=lambda k: (ranks.get(k, len(ranks)), k))
    return {
        k: score([predicted[i] for i in tagged[k]], [gold[i] for i in tagged[k]]) for k in names
    }


def read_records(
    path: Path, check: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (UTF-8, a byte-order mark allowed; blank lines skipped),
    checked enough to be scored or trained on: an object with a ``text`` string and ``triples``
    and/or ``entities`` (a record with no facts says ``"triples": []``), ``patterns`` optional;
    then ``check`` (``labels_check``: what a given model can find), if given.

    Raises ``DataError`` naming the line of the first bad record, or the file when it has none.
    """
    records: list[dict[str, Any]] = []
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}, line {number}: not UTF-8 (byte {exc.start + 1})"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                problem = f"not JSON ({exc.msg}, column {exc.colno})"
                raise DataError(f"{path}, line {number}: {problem}") from None
            except RecursionError:
                raise DataError(f"{path}, line {number}: JSON nested too deeply") from None
            except ValueError:  # an integer over Python's digit limit
                raise DataError(f"{path}, line {number}: a number too long to read") from None
            try:
                _check_record(record)
                if check is not None:
                    check(record)
            except ValueError as exc:
                raise DataError(f"{path}, line {number}: {exc}") from None
            records.append(record)
    if not records:
        raise DataError(f"{path}: no records (the file is empty or blank)")
    return records


def _check_record(record: Any) -> None:
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    if not isinstance(record.get("text"), str):
        raise ValueError("no 'text' string")
    if "triples" not in record and "entities" not in record:
        raise ValueError(
            "neither 'triples' nor 'entities' (a record with no facts says \"triples\": [])"
        )
    for key, size in (("triples", 3), ("entities", 2)):
        items = record.get(key, [])
        if not isinstance(items, list) or not all(
            isinstance(x, list) and len(x) == size and all(isinstance(v, str) for v in x)
            for x in items
        ):
            raise ValueError(f"'{key}' is not a list of [{', '.join(['string'] * size)}]")
    tags = record.get("patterns", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and t.strip() for t in tags):
        raise ValueError("'patterns' is not a list of non-empty strings")


def labels_check(
    task: str, labels: Sequence[str] | None = None
) -> Callable[[dict[str, Any]], None]:
    """A ``read_records`` check for a model of ``task``: a triples model's records give their
    ``triples`` (an entities model's, ``entities`` or ``triples``); every argument or entity a
    record uses is a non-empty part of its text (a model answers spans of the text: no model could
    find another); an entities model given only triples types their arguments by the demo schema
    (``training.schema.triple_entities``), whose predicates they must then use. With ``labels``
    (what training uses), every predicate (triples) or entity type (entities) must also be one of
    them: training on a label the model has no head for would drop it unsaid. Scoring takes any
    label (a predicate the model lacks is a row of misses in its table).

    >>> check = labels_check("triples", ["作者"])
    >>> check({"text": "《家》的作者是巴金。", "triples": [["家", "作者", "巴金"]]})
    >>> check({"text": "《家》的作者是巴金。", "triples": [["家", "作曲", "巴金"]]})
    Traceback (most recent call last):
    ...
    ValueError: predicate '作曲' is not one of the model's 1 predicates (作者)
    """
    from training.schema import SCHEMA

    kind = "predicate" if task == Task.TRIPLES else "entity type"
    shown = "" if labels is None else ", ".join(labels[:6]) + (", ..." if len(labels) > 6 else "")
    demo = {p for p, _, _ in SCHEMA}

    def labelled(label: str) -> None:
        if labels is not None and label not in labels:
            raise ValueError(
                f"{kind} {label!r} is not one of the model's {len(labels)} {kind}s ({shown})"
            )

    def in_text(text: str, name: str, where: str) -> None:
        if not name.strip() or name not in text:
            raise ValueError(f"{where}: {name!r} is not in the text")

    def check(record: dict[str, Any]) -> None:
        text = record["text"]
        if task == Task.ENTITIES and "entities" in record:
            for name, type_ in record["entities"]:
                labelled(type_)
                in_text(text, name, f"entity [{name}, {type_}]")
            return
        if task == Task.TRIPLES and "triples" not in record:
            raise ValueError(
                "no 'triples' for a triples model (a text with none says \"triples\": [])"
            )
        for s, p, o in record.get("triples", []):
            if task == Task.TRIPLES:
                labelled(p)
            elif p not in demo:
                raise ValueError(
                    f"predicate {p!r} is not one of the demo schema's, which types the arguments "
                    "of a record without 'entities': give the record its 'entities'"
                )
            for name in (s, o):
                in_text(text, name, f"triple [{s}, {p}, {o}]")

    return check


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


def _findable_by(model_dir: str | Path) -> Callable[[dict[str, Any]], None]:
    """``_scorable`` for the model in ``model_dir`` (its manifest only: nothing is loaded)."""
    from nlp.manifest import load_manifest

    return _scorable(load_manifest(model_dir).task)


def _scorable(task: str) -> Callable[[dict[str, Any]], None]:
    """``labels_check`` for scoring (any label), and the check every text gets before a model sees
    it (``nlp.validation``: at most the extractor's default length, no NUL, no lone surrogate), so
    that a text the model cannot be given is named by its line before the model loads."""
    from nlp.config import DEFAULT_MAX_TEXT_CHARS
    from nlp.errors import SpoError
    from nlp.validation import check_text

    findable = labels_check(task)

    def check(record: dict[str, Any]) -> None:
        try:
            check_text(record["text"], DEFAULT_MAX_TEXT_CHARS, "'text'")
        except SpoError as exc:
            raise ValueError(exc.message) from None
        findable(record)

    return check


def model_precision(model_dir: str | Path) -> str:
    """The precision a model directory runs in by default: its own (``int8`` after quantization)."""
    from nlp.manifest import load_manifest

    return load_manifest(model_dir).precision


def _shown_entities(items: set[Any], text: str) -> list[Any]:
    return [[s, e, t, text[s:e]] for s, e, t in sorted(items)]


def _shown_triples(items: set[Any], text: str) -> list[Any]:
    return sorted(items)


@dataclass(frozen=True)
class _Scoring:
    """How a task's output is scored: ``predict`` and ``gold`` items per record, the name of an
    item's ``label`` and how to read it (``label_of``), how a wrong item is ``shown``."""

    predict: Callable[[Any, Sequence[str]], list[set[Any]]]
    gold: Callable[[dict[str, Any]], set[Any]]
    label: str
    label_of: Callable[[Any], str]
    shown: Callable[[set[Any], str], list[Any]]


SCORING = {
    Task.TRIPLES: _Scoring(
        predict_triples, gold_triples, "predicate", itemgetter(1), _shown_triples
    ),
    Task.ENTITIES: _Scoring(
        predict_entities, gold_entities, "type", itemgetter(2), _shown_entities
    ),
}


@dataclass(frozen=True)
class _Run:
    """A model's predictions on records and their gold, for the model's task."""

    task: Task
    labels: tuple[str, ...]  # the model's predicates or entity types, in output order
    predicted: list[set[Any]]
    gold: list[set[Any]]


def _predict(
    model_dir: str | Path, precision: str | None, records: Sequence[dict[str, Any]]
) -> _Run:
    from nlp.pipeline import Extractor

    texts = [r["text"] for r in records]
    with Extractor.load(model_dir, precision=precision or model_precision(model_dir)) as extractor:
        manifest = extractor.manifest
        scoring = SCORING[manifest.task]
        predicted = scoring.predict(extractor, texts)
        gold = [scoring.gold(r) for r in records]
        return _Run(manifest.task, manifest.labels, predicted, gold)


def report(records: Sequence[dict[str, Any]], run: _Run) -> Report:
    """The scores of ``run`` on ``records``: overall, per label, per pattern."""
    overall = score(run.predicted, run.gold)
    scoring = SCORING[run.task]
    return Report(
        overall.true_positives,
        overall.predicted,
        overall.gold,
        overall.records,
        label=scoring.label,
        by_label=score_by_label(run.predicted, run.gold, scoring.label_of, run.labels),
        by_pattern=score_by_pattern(
            [r.get("patterns", []) for r in records], run.predicted, run.gold
        ),
    )


def evaluate(
    model_dir: str | Path, data_path: str | Path, *, precision: str | None = None
) -> tuple[Report, list[dict[str, Any]]]:
    """Scores of ``model_dir`` on ``data_path`` (overall, per label, per pattern), and the records
    it got wrong (for inspection, with their patterns if they have any).

    The model's task decides what is scored: triples, or entities (errors then list
    ``[start, end, type, text]``). ``precision`` ``None``: the model's own (fp32, or int8 for a
    quantized directory).
    """
    records = read_records(Path(data_path), check=_findable_by(model_dir))
    run = _predict(model_dir, precision, records)
    shown = SCORING[run.task].shown

    errors = []
    for r, p, g in zip(records, run.predicted, run.gold, strict=True):
        if p != g:
            error = {"text": r["text"], "missed": shown(g - p, r["text"])}
            error["spurious"] = shown(p - g, r["text"])
            if r.get("patterns"):
                error["patterns"] = r["patterns"]
            errors.append(error)
    return report(records, run), errors


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


def _made_from(manifest: Any) -> str | None:
    """The sha256 of the ``saved_model.pb`` a converted model (int8, onnx, openvino) was made from,
    as its ``model.json`` records it; None for a model trained or exported as it is."""
    spec = manifest.engine_spec
    record = spec.source if spec is not None else (manifest.quantization or {}).get("parent", {})
    sha = record.get("saved_model_sha256") if isinstance(record, dict) else None
    return sha if isinstance(sha, str) else None


def _own_graph(manifest: Any) -> str | None:
    """The sha256 of a SavedModel directory's own ``saved_model.pb`` (None for another engine)."""
    from nlp.manifest import sha256_file

    graph = manifest.directory / "saved_model.pb"
    return sha256_file(graph) if manifest.engine_spec is None and graph.is_file() else None


def compare(
    model_dir: str | Path,
    baseline_dir: str | Path,
    data_path: str | Path,
    *,
    precision: str | None = None,
    baseline_precision: str | None = None,
) -> Comparison:
    """Scores of both models on ``data_path``, and on how many texts their results are identical.
    Both must answer the same task (``MismatchError``): triples and entities share no result."""
    from nlp.manifest import load_manifest

    manifests = load_manifest(model_dir), load_manifest(baseline_dir)
    tasks = manifests[0].task, manifests[1].task
    if tasks[0] != tasks[1]:
        raise MismatchError(
            f"{model_dir} answers {tasks[0]} and the baseline {baseline_dir} answers {tasks[1]}: "
            "compare two models of one task"
        )
    made_from = [_made_from(m) for m in manifests]
    if any(made_from):
        lineage = [p or _own_graph(m) for p, m in zip(made_from, manifests, strict=True)]
        if None not in lineage and lineage[0] != lineage[1]:
            logger.warning(
                "%s and the baseline %s do not come from one model (their SavedModels' "
                "saved_model.pb differ: %s... and %s...): the comparison measures two models, not "
                "a conversion",
                model_dir,
                baseline_dir,
                str(lineage[0])[:12],
                str(lineage[1])[:12],
            )
    records = read_records(Path(data_path), check=_scorable(tasks[0]))
    run = _predict(model_dir, precision, records)
    reference = _predict(baseline_dir, baseline_precision, records).predicted
    same = sum(p == r for p, r in zip(run.predicted, reference, strict=True))
    return Comparison(score(run.predicted, run.gold), score(reference, run.gold), same)
