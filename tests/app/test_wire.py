"""Issue 20: the wire shape of an entity, a triple, a result and an error is defined once
(``nlp.values``); ``to_dict``, the OpenAPI schemas and the Spark columns all come from it and agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest

from app.batch.output import dumps_line
from app.core.settings import Settings
from app.web.openapi import build_spec
from nlp.values import (
    ENTITY,
    EXTRACTION,
    FAILURE,
    TRIPLE,
    Entity,
    Extraction,
    Failure,
    Span,
    Triple,
)

SUBJECT = Entity(Span(0, 3, "周杰伦"), "人物")
OBJECT = Entity(Span(6, 8, "台湾"), "地点")
SAMPLE = Extraction((SUBJECT, OBJECT), (Triple(SUBJECT, "出生地", OBJECT),))


def _keys(value: Any) -> Any:
    """The member names of a JSON value, nested (lists by their first item)."""
    if isinstance(value, dict):
        return {k: _keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_keys(value[0])] if value else []
    return None


def test_wire_to_dict_is_the_shape_in_order() -> None:
    doc = SAMPLE.to_dict()
    assert list(doc) == [m.name for m in EXTRACTION.members]
    assert (
        list(doc["entities"][0])
        == [m.name for m in ENTITY.members]
        == ["text", "start", "end", "type"]
    )
    assert list(doc["triples"][0]) == [m.name for m in TRIPLE.members]
    assert Failure("text_too_long", "too long").to_dict() == {
        "error": {"code": "text_too_long", "message": "too long"}
    }
    assert [m.name for m in FAILURE.members] == ["error"]


def test_wire_batch_line_bytes_are_unchanged() -> None:
    """The batch output line of a typed outcome, byte for byte as before typed outcomes."""
    assert (
        dumps_line(7, SAMPLE)
        == (
            '{"id":7,"entities":[{"text":"周杰伦","start":0,"end":3,"type":"人物"},'
            '{"text":"台湾","start":6,"end":8,"type":"地点"}],"triples":[{"subject":{"text":"周杰伦",'
            '"start":0,"end":3,"type":"人物"},"predicate":"出生地","object":{"text":"台湾","start":6,'
            '"end":8,"type":"地点"}}]}\n'
        ).encode()
    )
    assert dumps_line("a", Failure("invalid_input", "bad")) == (
        b'{"id":"a","error":{"code":"invalid_input","message":"bad"}}\n'
    )


def test_wire_openapi_schemas_are_the_shape(triples_model_dir: Path) -> None:
    spec = build_spec(Settings(model_dir=triples_model_dir, workers=1))
    schemas = spec["components"]["schemas"]
    for shape in (ENTITY, TRIPLE):
        schema = schemas[shape.name]
        assert list(schema["properties"]) == schema["required"] == [m.name for m in shape.members]
        assert schema["additionalProperties"] is False
    item = schemas["ExtractResponse"]["properties"]["results"]["items"]
    assert list(item["properties"]) == [m.name for m in EXTRACTION.members]
    # A response holding ``SAMPLE.to_dict()`` is valid against the document, and one with a member
    # the shape does not have is not.
    document = {
        "model": {"name": "m", "version": "1", "task": "triples"},
        "results": [SAMPLE.to_dict()],
    }
    validator = jsonschema_rs.validator_for(
        {**schemas["ExtractResponse"], "components": {"schemas": schemas}}
    )
    assert validator.is_valid(document)
    document["results"][0]["entities"][0]["extra"] = 1
    assert not validator.is_valid(document)


def test_wire_spark_columns_are_the_shape() -> None:
    pytest.importorskip("pyspark", reason="the spark extra (make extra-spark)")
    pa = pytest.importorskip("pyarrow")
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    from app.spark import job as spark

    fields = T.StructType(list(spark.RESULT_FIELDS))
    assert [f.name for f in fields] == [m.name for m in (*EXTRACTION.members, *FAILURE.members)]
    outcomes = [SAMPLE, Failure("invalid_input", "bad")]
    schema = to_arrow_schema(fields)
    table = pa.Table.from_arrays(spark._result_arrays(outcomes, schema), schema=schema)
    rows = table.to_pylist()
    assert rows[0] == {**SAMPLE.to_dict(), "error": None}
    assert rows[1] == {"entities": None, "triples": None, **outcomes[1].to_dict()}
    assert _keys(rows[0]["entities"]) == _keys(SAMPLE.to_dict()["entities"])
