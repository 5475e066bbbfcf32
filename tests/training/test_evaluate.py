import json
from pathlib import Path

from training.evaluate import gold_triples, read_records, score

EVERYDAY = Path(__file__).parent / "data" / "everyday.jsonl"


def test_evaluate_micro_scores() -> None:
    pred = [{("a", "p", "b"), ("a", "p", "x")}, set(), {("c", "q", "d")}]
    gold = [{("a", "p", "b")}, {("e", "p", "f")}, {("c", "q", "d")}]
    s = score(pred, gold)
    assert (s.true_positives, s.predicted, s.gold, s.records) == (2, 3, 3, 3)
    assert abs(s.precision - 2 / 3) < 1e-9 and abs(s.recall - 2 / 3) < 1e-9
    assert abs(s.f1 - 2 / 3) < 1e-9


def test_evaluate_empty_is_zero_not_an_error() -> None:
    s = score([set()], [set()])
    assert (s.precision, s.recall, s.f1) == (0.0, 0.0, 0.0)


def test_evaluate_everyday_set_is_well_formed() -> None:
    records = read_records(EVERYDAY)
    assert len(records) >= 30
    for r in records:
        for s, _p, o in gold_triples(r):
            assert s in r["text"] and o in r["text"], json.dumps(r, ensure_ascii=False)
