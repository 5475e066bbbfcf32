import doctest
import json

import numpy as np
import pytest

from nlp import tasks as tasks_module
from nlp.manifest import manifest_document, parse_manifest
from nlp.tasks import TASK_NAMES, PredicateSchema, Task, task_named
from nlp.values import Entity, Span, Triple

SCHEMA = (PredicateSchema("出生地", "人物", "地点"), PredicateSchema("作者", "作品", "人物"))


class _Labels:
    predicates = SCHEMA
    entity_types = ("人物", "地点")
    link_rule = "both"


class _MeanLinks(_Labels):
    link_rule = "mean"


def _span_of(text):
    """Row positions 1..n are characters 0..n-1 of ``text`` (one token per character)."""
    return lambda head, tail: Span(head - 1, tail, text[head - 1 : tail])


def _logits(heads, length, hits):
    out = np.full((heads, length, length), -10.0, dtype=np.float32)
    for h, i, j in hits:
        out[h, i, j] = 10.0
    return out


def test_tasks_are_their_model_json_names():
    assert TASK_NAMES == ("triples", "entities")
    assert [task_named(n) for n in TASK_NAMES] == [Task.TRIPLES, Task.ENTITIES]
    assert (
        Task.TRIPLES == "triples" and json.dumps({"task": Task.ENTITIES}) == '{"task": "entities"}'
    )
    assert {Task.TRIPLES: 1}["triples"] == 1  # the same key as its string
    assert (Task.TRIPLES.n_outputs, Task.ENTITIES.n_outputs) == (3, 1)
    with pytest.raises(ValueError, match="expected one of triples, entities, got 'ner'"):
        task_named("ner")


def test_tasks_labels_by_name_and_as_written():
    assert Task.TRIPLES.label_names(_Labels()) == ("出生地", "作者")
    assert Task.ENTITIES.label_names(_Labels()) == ("人物", "地点")
    assert Task.TRIPLES.labels_document(SCHEMA)[1] == {
        "predicate": "作者",
        "subject_type": "作品",
        "object_type": "人物",
    }
    assert Task.ENTITIES.labels_document(("人物",)) == ["人物"]


def test_tasks_entities_decoder_types_each_span():
    text = "张三生于北京"
    # type 1 (地点) at tokens 5..6, type 0 (人物) at 1..2; the row is [CLS] + 6 + [SEP] + padding
    logits = _logits(2, 10, [(0, 1, 2), (1, 5, 6)])
    entities, triples = Task.ENTITIES.decode([logits], len(text), 0.0, _Labels(), _span_of(text))
    assert sorted(entities, key=lambda e: e.span.start) == [
        Entity(Span(0, 2, "张三"), "人物"),
        Entity(Span(4, 6, "北京"), "地点"),
    ]
    assert triples == []


def test_tasks_triples_decoder_types_arguments_by_the_predicate():
    text = "张三生于北京"
    entity = _logits(2, 10, [(0, 1, 2), (1, 5, 6)])  # subject 1..2, object 5..6
    head = _logits(2, 10, [(0, 1, 5)])  # predicate 0 at (subject head, object head)
    tail = _logits(2, 10, [(0, 2, 6)])  # and at (subject tail, object tail)
    entities, triples = Task.TRIPLES.decode(
        [entity, head, tail], len(text), 0.0, _Labels(), _span_of(text)
    )
    subject, obj = Entity(Span(0, 2, "张三"), "人物"), Entity(Span(4, 6, "北京"), "地点")
    assert triples == [Triple(subject, "出生地", obj)]
    assert set(entities) == {subject, obj}
    # head-head alone is not enough: the tail-tail matrix must agree
    assert Task.TRIPLES.decode(
        [entity, head, _logits(2, 10, [])], len(text), 0.0, _Labels(), _span_of(text)
    ) == ([], [])


def test_tasks_triples_decoder_follows_the_models_link_rule():
    text = "张三生于北京"
    entity = _logits(2, 10, [(0, 1, 2), (1, 5, 6)])
    head = _logits(2, 10, [(0, 1, 5)])  # +10 at (subject head, object head)
    tail = _logits(2, 10, [])
    tail[0, 2, 6] = -4.0  # doubtful at the tails: the mean (3) is above 0, one score is not
    decode = Task.TRIPLES.decode
    assert decode([entity, head, tail], len(text), 0.0, _Labels(), _span_of(text)) == ([], [])
    _, triples = decode([entity, head, tail], len(text), 0.0, _MeanLinks(), _span_of(text))
    assert [(t.subject.span.text, t.predicate, t.object.span.text) for t in triples] == [
        ("张三", "出生地", "北京")
    ]
    # the mean is taken per predicate: predicate 1 (作者) scores -10 at both ends
    tail[0, 2, 6] = -11.0
    assert decode([entity, head, tail], len(text), 0.0, _MeanLinks(), _span_of(text)) == ([], [])


def test_tasks_triples_decoder_keeps_a_limited_predicates_best_links():
    """意大利首都罗马西班牙首都马德里 read as tokens: both countries link to both cities, the straight
    pairs best; 首都 ``one_to_one`` keeps those two, unlimited it keeps all four."""
    text = "意大利首都罗马西班牙首都马德里"
    entity = _logits(2, 17, [(0, 1, 3), (0, 8, 10), (1, 6, 7), (1, 13, 15)])
    head = _logits(1, 17, [(0, 1, 6), (0, 8, 13)])
    tail = _logits(1, 17, [(0, 3, 7), (0, 10, 15)])
    head[0, 1, 13] = head[0, 8, 6] = tail[0, 3, 15] = tail[0, 10, 7] = 2.0  # crossed, weaker

    class _Capitals:
        entity_types = ()
        link_rule = "both"

        def __init__(self, cardinality):
            self.predicates = (PredicateSchema("首都", "国家", "城市", cardinality),)

    def pairs(cardinality):
        _, found = Task.TRIPLES.decode(
            [entity, head, tail], len(text), 0.0, _Capitals(cardinality), _span_of(text)
        )
        return sorted((t.subject.span.text, t.object.span.text) for t in found)

    assert pairs("one_to_one") == [("意大利", "罗马"), ("西班牙", "马德里")]
    assert len(pairs("many_to_many")) == 4


@pytest.mark.parametrize("task", list(Task))
def test_tasks_manifest_document_writes_only_the_tasks_labels(task, tmp_path):
    doc = manifest_document(
        name="m",
        version="1",
        task=task,
        vocab_path="vocab.txt",
        vocab_sha256="0" * 64,
        max_length=16,
        predicates=[p.to_dict() for p in SCHEMA],
        entity_types=["人物", "地点"],
    )
    other = {"predicates", "entity_types"} - {task.labels_field}
    assert doc["task"] == task.value and task.labels_field in doc and not other & set(doc)
    manifest = parse_manifest(doc, tmp_path, check_files=False)
    assert manifest.task is task and manifest.n_outputs == task.n_outputs
    assert manifest.summary()[task.labels_field] == doc[task.labels_field]
    # a link rule is a triples model's: written, read and reported for it alone
    assert ("link_rule" in doc) == ("link_rule" in manifest.summary()) == (task is Task.TRIPLES)
    assert manifest.link_rule == "both"


def test_tasks_output_heads_follow_the_labels_in_role_order():
    """The entity output has two heads whatever the labels; head, tail and entities one per label."""
    triples = Task.TRIPLES.output_heads(_Labels())
    assert [(o.role, o.heads) for o in triples] == [("entity", 2), ("head", 2), ("tail", 2)]
    assert "one per predicate" in triples[1].why and "predicates" in triples[1].fix
    assert "role order (entity, head, tail)" in triples[0].fix
    (entities,) = Task.ENTITIES.output_heads(_Labels())
    assert (entities.role, entities.heads, entities.why) == (
        "entities",
        2,
        "one per entity type in model.json",
    )


def test_tasks_doctests():
    assert doctest.testmod(tasks_module).failed == 0
