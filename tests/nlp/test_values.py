import pytest

from nlp.values import Entity, Extraction, Span, Triple


def test_types_span_checks_offsets_against_text():
    assert Span(2, 4, "北京").text == "北京"
    for start, end, text in [(2, 2, ""), (3, 2, "x"), (-1, 1, "xx"), (0, 2, "x")]:
        with pytest.raises(ValueError):
            Span(start, end, text)


def test_types_to_dict_is_the_wire_format():
    subject = Entity(Span(0, 3, "周杰伦"), "人物")
    obj = Entity(Span(6, 8, "台湾"), "地点")
    triple = Triple(subject, "出生地", obj)
    assert triple.to_dict() == {
        "subject": {"text": "周杰伦", "start": 0, "end": 3, "type": "人物"},
        "predicate": "出生地",
        "object": {"text": "台湾", "start": 6, "end": 8, "type": "地点"},
    }
    assert Extraction((subject, obj), (triple,)).to_dict()["entities"][1]["type"] == "地点"


def test_types_values_compare_by_fields_and_hash():
    a = Triple(Entity(Span(0, 1, "a"), "t"), "p", Entity(Span(1, 2, "b"), "t"))
    b = Triple(Entity(Span(0, 1, "a"), "t"), "p", Entity(Span(1, 2, "b"), "t"))
    assert a == b and len({a, b}) == 1
