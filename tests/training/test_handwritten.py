"""The hand-written training sentences (``training/handwritten.jsonl``): well-formed training
records, and kept apart from the hand-written evaluation sets, whose scores would otherwise
measure what the model memorised rather than how it reads."""

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

from training.corpus import hand_written_records
from training.schema import PREDICATES, SPOUSE_INVERSE

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = ROOT / "training" / "handwritten.jsonl"
EVALUATION = sorted((Path(__file__).parent / "data").glob("everyday*.jsonl"))


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return [json.loads(line) for line in SENTENCES.read_text(encoding="utf-8").splitlines()]


def test_handwritten_records_are_training_records(docs: list[dict]) -> None:
    assert len(docs) >= 2000
    for n, doc in enumerate(docs, 1):
        assert set(doc) == {"text", "triples"}, n
        text = doc["text"]
        assert text == text.strip() and 8 <= len(text) <= 90, n
        triples = {tuple(t) for t in doc["triples"]}
        assert len(triples) == len(doc["triples"]), f"line {n}: a triple twice"
        for s, p, o in triples:
            assert p in PREDICATES, f"line {n}: {p}"
            assert s and o and s in text and o in text, f"line {n}: {s} {o}"
            if p in SPOUSE_INVERSE:
                assert (o, SPOUSE_INVERSE[p], s) in triples, f"line {n}: spouse without its pair"
    assert len({d["text"] for d in docs}) == len(docs)


def test_handwritten_arguments_are_labelled_where_they_are_meant(docs: list[dict]) -> None:
    # Training labels an argument at its first occurrence (training.train.encode_record): one whose
    # first occurrence lies inside another argument's (北京 in 北京大学 before 北京) would be
    # labelled in the wrong place. The generator keeps the same rule (training.corpus._valid).
    for n, doc in enumerate(docs, 1):
        text = doc["text"]
        names = {x for s, _, o in doc["triples"] for x in (s, o)}
        for a in names:
            for b in names:
                inside = a != b and a in b and 0 <= text.find(a) - text.find(b) < len(b)
                assert not inside, f"line {n}: {a} first occurs inside {b}"


def test_handwritten_records_cover_every_predicate_and_some_texts_state_nothing(
    docs: list[dict],
) -> None:
    per_predicate = Counter(p for d in docs for _, p, _ in d["triples"])
    assert min(per_predicate[p] for p in PREDICATES) >= 50, per_predicate
    assert 0.05 <= sum(not d["triples"] for d in docs) / len(docs) <= 0.15


def test_handwritten_records_share_no_text_and_no_fact_with_the_evaluation_sets(
    docs: list[dict],
) -> None:
    # Counts only, never the texts: the unseen set's sentences stay unread.
    def digest(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    texts = {digest(d["text"]) for d in docs}
    facts = {tuple(t) for d in docs for t in d["triples"]}
    assert len(EVALUATION) == 4
    for path in EVALUATION:
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        same_text = sum(digest(r["text"]) in texts for r in records)
        same_fact = sum(tuple(t) in facts for r in records for t in r["triples"])
        assert (same_text, same_fact) == (0, 0), (
            f"{path.name}: {same_text} texts, {same_fact} facts"
        )


def test_handwritten_records_load_as_the_corpus_writes_them(docs: list[dict]) -> None:
    records = hand_written_records()
    assert [r.text for r in records] == [d["text"] for d in docs]
    assert [[list(t) for t in r.triples] for r in records] == [d["triples"] for d in docs]
