import json
from pathlib import Path

from training.evaluate import gold_entities, gold_triples, read_records, score

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


def test_evaluate_gold_entities_are_positions_of_every_mention() -> None:
    rec = {
        "text": "王芳去了济南大学，王芳喜欢济南。",
        "triples": [["王芳", "毕业院校", "济南大学"]],
        "entities": [["王芳", "人物"], ["济南大学", "机构"], ["济南", "地点"]],
    }
    assert gold_entities(rec) == {(0, 2, "人物"), (4, 8, "机构"), (9, 11, "人物"), (13, 15, "地点")}
    # Without "entities" (a triples-only file), the typed triple arguments.
    del rec["entities"]
    assert gold_entities(rec) == {(0, 2, "人物"), (4, 8, "机构"), (9, 11, "人物")}
