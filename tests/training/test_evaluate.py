import codecs
import doctest
import hashlib
import json
import re
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

from training import evaluate as evaluate_module
from training.evaluate import (
    PATTERNS,
    DataError,
    Report,
    gold_entities,
    gold_triples,
    labels_check,
    read_records,
    score,
    score_by_label,
    score_by_pattern,
)
from training.schema import PREDICATES, SPOUSE_INVERSE

DATA = Path(__file__).parent / "data"
EVERYDAY = DATA / "everyday.jsonl"
UNSEEN = DATA / "everyday_unseen.jsonl"
DEV = DATA / "everyday_dev.jsonl"
DEV2 = DATA / "everyday_dev2.jsonl"


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


# -- the hand-written everyday sets of issue 23: unseen (the test set), dev and dev2 (for tuning) --

# set file, least records, least records per pattern
EVERYDAY_SETS = [
    pytest.param(UNSEEN, 150, 4, id="unseen"),
    pytest.param(DEV, 160, 5, id="dev"),
    pytest.param(DEV2, 500, 20, id="dev2"),
]


def _texts_hashes(path: Path) -> set[str]:
    return {hashlib.sha256(r["text"].encode("utf-8")).hexdigest() for r in read_records(path)}


@pytest.mark.parametrize(("path", "least", "_per_pattern"), EVERYDAY_SETS)
def test_evaluate_everyday_set_of_issue_23_is_well_formed(
    path: Path, least: int, _per_pattern: int
) -> None:
    """Every argument is a span of its text, every predicate is the schema's, spouses go both
    ways, every record is tagged with known patterns, and no text repeats the older set."""
    records = read_records(path)
    assert len(records) >= least
    texts = [r["text"] for r in records]
    assert len(set(texts)) == len(texts)
    assert not set(texts) & {r["text"] for r in read_records(EVERYDAY)}
    for r in records:
        shown = json.dumps(r, ensure_ascii=False)
        triples = gold_triples(r)
        assert len(triples) == len(r["triples"]), shown  # no duplicate triple
        for s, p, o in triples:
            assert p in PREDICATES, shown
            assert s in r["text"] and o in r["text"], shown
            for arg in (s, o):
                assert arg == arg.strip() and not set(arg) & set("《》“”"), shown
            if p in SPOUSE_INVERSE:
                assert (o, SPOUSE_INVERSE[p], s) in triples, shown
        tags = r["patterns"]
        assert tags and len(set(tags)) == len(tags) and set(tags) <= set(PATTERNS), shown
        assert ("no_fact" in tags) == (not triples), shown
        if "multi_fact" in tags:
            assert len(triples) >= 2, shown


@pytest.mark.parametrize(("path", "_least", "per_pattern"), EVERYDAY_SETS)
def test_evaluate_everyday_set_of_issue_23_covers_every_predicate_and_pattern(
    path: Path, _least: int, per_pattern: int
) -> None:
    records = read_records(path)
    per_predicate = Counter(p for r in records for _, p, _ in gold_triples(r))
    tagged = Counter(t for r in records for t in r["patterns"])
    assert {p: n for p, n in per_predicate.items() if n < 8} == {}
    assert set(per_predicate) == set(PREDICATES)
    assert {t: n for t, n in tagged.items() if n < per_pattern} == {}
    assert set(tagged) == set(PATTERNS)


@pytest.mark.parametrize(("first", "second"), [(DEV, UNSEEN), (DEV2, UNSEEN), (DEV2, DEV)])
def test_evaluate_tuning_sets_share_no_text_with_each_other_or_the_unseen_set(
    first: Path, second: Path
) -> None:
    """Compared as hashes, and a failure reports only a count: the unseen texts are never shown."""
    shared = len(_texts_hashes(first) & _texts_hashes(second))
    assert shared == 0, f"{shared} text(s) of {first.name} equal texts of {second.name}"


# -- scores per label and per pattern ------------------------------------------------------------


def test_evaluate_scores_by_predicate_count_each_label_apart() -> None:
    pred = [{("a", "p", "b"), ("a", "q", "x")}, {("c", "p", "d")}, set()]
    gold = [{("a", "p", "b"), ("a", "q", "c")}, {("c", "p", "e")}, {("f", "r", "g")}]
    by = score_by_label(pred, gold, lambda t: t[1], order=("r", "q"))
    assert list(by) == ["r", "q", "p"]  # the model's order first, then the rest sorted
    counts = {k: (s.true_positives, s.predicted, s.gold, s.records) for k, s in by.items()}
    assert counts == {"p": (1, 2, 2, 2), "q": (0, 1, 1, 1), "r": (0, 0, 1, 1)}
    overall = score(pred, gold)
    assert sum(s.true_positives for s in by.values()) == overall.true_positives
    assert sum(s.predicted for s in by.values()) == overall.predicted
    assert sum(s.gold for s in by.values()) == overall.gold


def test_evaluate_scores_by_pattern_count_the_tagged_records_only() -> None:
    pred = [{1, 2}, {3}, {4}, set()]
    gold = [{1}, {3}, {5}, set()]
    tags = [["passive", "multi_fact"], ["own_tag"], ["passive", "passive"], []]
    by = score_by_pattern(tags, pred, gold)
    assert list(by) == ["passive", "multi_fact", "own_tag"]  # PATTERNS order, then the others
    assert (by["passive"].records, by["passive"].true_positives) == (2, 1)
    assert (by["passive"].predicted, by["passive"].gold) == (3, 2)
    assert (by["own_tag"].records, by["own_tag"].f1) == (1, 1.0)
    assert score_by_pattern([[], []], [set(), set()], [set(), set()]) == {}


def _report() -> Report:
    pred = [{("张三", "出生地", "北京")}, {("x", "首都", "y")}]
    gold = [{("张三", "出生地", "北京"), ("张三", "民族", "汉族")}, set()]
    overall = score(pred, gold)
    return Report(
        overall.true_positives,
        overall.predicted,
        overall.gold,
        overall.records,
        by_label=score_by_label(pred, gold, lambda t: t[1]),
        by_pattern=score_by_pattern([["apposition"], ["no_fact"]], pred, gold),
    )


def test_evaluate_report_json_keeps_the_overall_fields_and_adds_the_breakdowns() -> None:
    doc = _report().to_dict()
    assert (doc["records"], doc["gold"], doc["predicted"], doc["correct"]) == (2, 2, 2, 1)
    assert set(doc["by_predicate"]) == {"出生地", "民族", "首都"}
    assert doc["by_predicate"]["民族"]["recall"] == 0.0
    assert doc["by_pattern"]["no_fact"] == {
        "records": 1, "gold": 0, "predicted": 1, "correct": 0,
        "precision": 0.0, "recall": 0.0, "f1": 0.0,
    }  # fmt: skip
    plain = Report(1, 1, 1, 1, by_label={}).to_dict()
    assert "by_pattern" not in plain and plain["by_predicate"] == {}


def test_evaluate_report_text_is_aligned_tables_with_chinese_labels() -> None:
    text = _report().to_text("set on model")
    lines = text.splitlines()
    assert lines[0] == "set on model"
    rows = [line for line in lines[1:] if line]
    width = {sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in r) for r in rows}
    assert len(width) == 1  # every row as wide as its header, Chinese characters counted double
    assert [r.split()[0] for r in rows if r.split()[0] in {"predicate", "pattern"}] == [
        "predicate",
        "pattern",
    ]
    assert any(r.startswith("民族") and r.split()[1:4] == ["1", "1", "0"] for r in rows)
    assert any(r.startswith("all") and r.split()[-1] == "0.500" for r in rows)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 2: not JSON (Expecting value, column 1)"),
        ('["a list"]', "line 2: not a JSON object"),
        ('{"triples": []}', "line 2: no 'text' string"),
        ('{"text": "x", "triples": [["a", "b"]]}', "line 2: 'triples' is not a list of [string"),
        ('{"text": "x", "entities": [["a", 1]]}', "line 2: 'entities' is not a list of [string"),
        ('{"text": "x", "triples": [], "patterns": "passive"}', "line 2: 'patterns' is not a list"),
        ('{"text": "x", "triples": [], "patterns": ["a", ""]}', "line 2: 'patterns' is not a list"),
        ('{"text": "x", "spo_list": []}', "line 2: neither 'triples' nor 'entities'"),
        ("\udcff", "line 2: not UTF-8 (byte 1)"),
        ("[" * 100_000, "line 2: JSON nested too deeply"),
        ('{"text": ' + "1" * 5000 + "}", "line 2: a number too long to read"),
    ],
    ids=lambda value: value[:20] if isinstance(value, str) else None,
)
def test_evaluate_read_records_names_the_bad_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "data.jsonl"
    first = '{"text": "张三出生于北京。", "triples": []}\n'
    # surrogateescape: "\udcff" writes the lone byte 0xff, which no UTF-8 text holds.
    path.write_bytes((first + line + "\n").encode("utf-8", errors="surrogateescape"))
    with pytest.raises(DataError, match=re.escape(message)):
        read_records(path)


def test_evaluate_read_records_skips_blank_lines_and_keeps_other_fields(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('\n{"text": "a", "triples": [], "id": 7}\n\n', encoding="utf-8")
    assert read_records(path) == [{"text": "a", "triples": [], "id": 7}]
    # A byte-order mark (as Windows editors write it) and CRLF line ends are read as text.
    path.write_bytes(codecs.BOM_UTF8 + b'{"text": "a", "triples": []}\r\n')
    assert read_records(path) == [{"text": "a", "triples": []}]


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_evaluate_read_records_refuses_a_file_without_records(tmp_path: Path, content: str) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=r"data\.jsonl: no records \(the file is empty or blank\)"):
        read_records(path)


@pytest.mark.parametrize(
    ("task", "record", "message"),
    [
        ("triples", {"triples": [["张三", "籍贯", "北京"]]}, "predicate '籍贯' is not one of the model's 2 predicates (出生地, 国籍)"),
        ("triples", {"triples": [["张三", "出生地", "上海"]]}, "triple [张三, 出生地, 上海]: '上海' is not in the text"),
        ("triples", {"triples": [["", "出生地", "北京"]]}, "triple [, 出生地, 北京]: '' is not in the text"),
        ("triples", {"entities": [["北京", "地点"]]}, "no 'triples' for a triples model"),
        ("entities", {"entities": [["北京", "城市"]]}, "entity type '城市' is not one of the model's 2 entity types (人物, 地点)"),
        ("entities", {"entities": [["上海", "地点"]]}, "entity [上海, 地点]: '上海' is not in the text"),
        ("entities", {"triples": [["张三", "籍贯", "北京"]]}, "predicate '籍贯' is not one of the demo schema's"),
        ("entities", {"triples": [["张三", "出生地", "上海"]]}, "triple [张三, 出生地, 上海]: '上海' is not in the text"),
    ],
)  # fmt: skip
def test_labels_check_refuses_what_the_model_could_never_find(
    tmp_path: Path, task: str, record: dict[str, object], message: str
) -> None:
    labels = {"triples": ["出生地", "国籍"], "entities": ["人物", "地点"]}[task]
    check = labels_check(task, labels)  # as training checks
    good = {"text": "张三出生于北京。", "triples": [["张三", "出生地", "北京"]]}
    check(good)
    check({**good, "entities": [["张三", "人物"], ["北京", "地点"]]})
    path = tmp_path / "data.jsonl"
    lines = [good, {"text": "张三出生于北京。", **record}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines), "utf-8")
    with pytest.raises(DataError, match=re.escape(f"line 2: {message}")):
        read_records(path, check=check)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("张" * 10_001, "line 2: 'text' has 10001 characters; the limit is 10000"),
        ("张三\x00出生于北京。", "line 2: 'text' contains NUL at index 2"),
        ("\ud800张三出生于北京。", "line 2: 'text' contains a lone surrogate (U+D800) at index 0"),
    ],
)
def test_evaluate_names_a_text_the_model_cannot_be_given_before_it_loads(
    triples_model_dir: Path, tmp_path: Path, text: str, message: str
) -> None:
    """The check every text gets before a model sees it (``nlp.validation``), by its line (was a
    traceback from the extractor, naming ``texts[0]`` of some batch); training keeps long texts."""
    path = tmp_path / "data.jsonl"
    lines = [{"text": "张三出生于北京。", "triples": []}, {"text": text, "triples": []}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(message)):
        evaluate_module.evaluate(triples_model_dir, path)
    with pytest.raises(DataError, match=re.escape(message)):
        evaluate_module.compare(triples_model_dir, triples_model_dir, path)
    assert read_records(path, check=labels_check("triples")) == lines  # as training reads


def test_evaluate_doctests() -> None:
    assert doctest.testmod(evaluate_module).failed == 0
