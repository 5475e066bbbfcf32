"""Typed domain values. Frozen, compared by fields, serialized only at the edge with ``to_dict()``.

An outcome is an ``Extraction`` or a ``Failure`` (an error value: a stable code and a message) until
the edge writes it out. The wire shape of each value (its JSON members, in order) is declared once
here as a ``Shape`` (``ENTITY``, ``TRIPLE``, ``EXTRACTION``, ``FAILURE``): ``to_dict`` encodes with it,
``app.web.openapi`` derives the OpenAPI schemas from it and ``app.spark.job`` the Spark/Parquet columns, and
``tests/app/test_wire.py`` checks that the three agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nlp.errors import SpoError


@dataclass(frozen=True)
class Member:
    """One member of a value's JSON form: its ``name``, its ``kind`` (``"string"``, ``"integer"``, or
    a nested ``Shape``), ``many`` for a list of them, how to read it from the value (``read``), and,
    for the schemas, what it means and its ``minimum``."""

    name: str
    kind: str | Shape
    read: Callable[[Any], Any]
    many: bool = False
    description: str = ""
    minimum: int | None = None

    def encode(self, value: Any) -> Any:
        got = self.read(value)
        kind = self.kind
        if not isinstance(kind, Shape):
            return got
        return [kind.encode(v) for v in got] if self.many else kind.encode(got)


@dataclass(frozen=True)
class Shape:
    """A value's JSON object: ``name`` (its schema's name) and its ``members``, in wire order."""

    name: str
    members: tuple[Member, ...]

    def encode(self, value: Any) -> dict[str, Any]:
        return {m.name: m.encode(value) for m in self.members}


@dataclass(frozen=True, order=True)
class Span:
    """A piece of the original text: ``text[start:end] == self.text`` (character offsets, end exclusive)."""

    start: int
    end: int
    text: str

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end or len(self.text) != self.end - self.start:
            raise ValueError(f"invalid span {self.start}:{self.end} for {self.text!r}")


@dataclass(frozen=True, order=True)
class Entity:
    """A typed span. For the triples task the type comes from the predicate schema."""

    span: Span
    type: str

    def to_dict(self) -> dict[str, Any]:
        return ENTITY.encode(self)


@dataclass(frozen=True, order=True)
class Triple:
    subject: Entity
    predicate: str
    object: Entity

    def to_dict(self) -> dict[str, Any]:
        return TRIPLE.encode(self)


@dataclass(frozen=True)
class Extraction:
    """Everything extracted from one text, sorted by position."""

    entities: tuple[Entity, ...] = field(default_factory=tuple)
    triples: tuple[Triple, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return EXTRACTION.encode(self)


@dataclass(frozen=True)
class Failure:
    """The error value that stands for a text's results (a bad record, a record past its time):
    a stable ``code`` (``nlp.errors``) and a ``message`` for humans."""

    code: str
    message: str

    @classmethod
    def of(cls, exc: SpoError) -> Failure:
        return cls(exc.code, exc.message)

    def to_dict(self) -> dict[str, Any]:
        return FAILURE.encode(self)


#: What a text's results or error are until the edge writes them.
Outcome = Extraction | Failure

# -- the wire shapes: the one definition of each value's JSON form --------------------------------
ENTITY = Shape(
    "Span",  # its name in the OpenAPI document since version 1
    (
        Member(
            "text", "string", lambda e: e.span.text, description="equals the input's [start:end]"
        ),
        Member(
            "start", "integer", lambda e: e.span.start, description="character offset", minimum=0
        ),
        Member(
            "end",
            "integer",
            lambda e: e.span.end,
            description="exclusive character offset",
            minimum=1,
        ),
        Member("type", "string", lambda e: e.type),
    ),
)
TRIPLE = Shape(
    "Triple",
    (
        Member("subject", ENTITY, lambda t: t.subject),
        Member("predicate", "string", lambda t: t.predicate),
        Member("object", ENTITY, lambda t: t.object),
    ),
)
EXTRACTION = Shape(
    "Extraction",
    (
        Member("entities", ENTITY, lambda x: x.entities, many=True),
        Member("triples", TRIPLE, lambda x: x.triples, many=True),
    ),
)
ERROR = Shape(
    "Error",
    (Member("code", "string", lambda f: f.code), Member("message", "string", lambda f: f.message)),
)
FAILURE = Shape("Failure", (Member("error", ERROR, lambda f: f),))
