"""Typed domain values. Frozen, compared by fields, serialized only at the edge with ``to_dict()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
        return {
            "text": self.span.text,
            "start": self.span.start,
            "end": self.span.end,
            "type": self.type,
        }


@dataclass(frozen=True, order=True)
class Triple:
    subject: Entity
    predicate: str
    object: Entity

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject.to_dict(),
            "predicate": self.predicate,
            "object": self.object.to_dict(),
        }


@dataclass(frozen=True)
class Extraction:
    """Everything extracted from one text, sorted by position."""

    entities: tuple[Entity, ...] = field(default_factory=tuple)
    triples: tuple[Triple, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "entities": [e.to_dict() for e in self.entities],
            "triples": [t.to_dict() for t in self.triples],
        }
