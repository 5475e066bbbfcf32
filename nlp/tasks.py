"""The tasks a model directory can serve, as a type: ``Task.TRIPLES`` and ``Task.ENTITIES``.

A task says how many model outputs there are and in which role order, which ``model.json`` field
lists its labels, and how one window's outputs decode into ``Entity`` and ``Triple`` values. A
``Task`` is a ``str`` (``Task.TRIPLES == "triples"``), so it is written as-is in ``model.json``, JSON
responses and CLI choices. Adding a third task is one member here (and, for a new kind of label, its
parser in ``nlp.manifest``).

>>> task_named("entities").n_outputs, Task.TRIPLES.labels_field
(1, 'predicates')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from nlp.decoding import CARDINALITIES, FloatArray, decode_spans, decode_triples
from nlp.values import Entity, Span, Triple


@dataclass(frozen=True)
class PredicateSchema:
    """A label of the triples task: a predicate, the types of its subject and object, and how many
    links it may make per text (``nlp.decoding.CARDINALITIES``; written only when limited)."""

    predicate: str
    subject_type: str
    object_type: str
    cardinality: str = CARDINALITIES[0]

    def to_dict(self) -> dict[str, str]:
        out = {
            "predicate": self.predicate,
            "subject_type": self.subject_type,
            "object_type": self.object_type,
        }
        if self.cardinality != CARDINALITIES[0]:
            out["cardinality"] = self.cardinality
        return out


class Labelled(Protocol):
    """Where a task finds its labels and its decoding rule (an ``nlp.manifest.Manifest``)."""

    @property
    def predicates(self) -> tuple[PredicateSchema, ...]: ...

    @property
    def entity_types(self) -> tuple[str, ...]: ...

    @property
    def link_rule(self) -> str: ...


# The character span of window tokens ``head..tail`` (row positions, ``[CLS]`` = 0).
SpanOf = Callable[[int, int], Span]
# One window's outputs (role order), its token count, the threshold, the labels -> what it found.
Decoder = Callable[
    [Sequence[FloatArray], int, float, Labelled, SpanOf], tuple[list[Entity], list[Triple]]
]


def _decode_entities(
    outputs: Sequence[FloatArray], n_tokens: int, threshold: float, model: Labelled, span: SpanOf
) -> tuple[list[Entity], list[Triple]]:
    """Typed GlobalPointer NER: one entity per (type, head, tail) above the threshold."""
    found = decode_spans(outputs[0], n_tokens, threshold)
    return [Entity(span(*e.span), model.entity_types[e.label]) for e in found], []


def _decode_triples(
    outputs: Sequence[FloatArray], n_tokens: int, threshold: float, model: Labelled, span: SpanOf
) -> tuple[list[Entity], list[Triple]]:
    """GPLinker: triples, and their arguments as entities typed by the predicate's schema."""
    made: dict[tuple[tuple[int, int], str], Entity] = {}

    def entity(tokens: tuple[int, int], type_: str) -> Entity:
        key = (tokens, type_)
        if key not in made:
            made[key] = Entity(span(*tokens), type_)
        return made[key]

    triples = []
    entity_logits, head_logits, tail_logits = outputs
    found = decode_triples(
        entity_logits,
        head_logits,
        tail_logits,
        n_tokens,
        threshold,
        model.link_rule,
        [p.cardinality for p in model.predicates],
    )
    for t in found:
        schema = model.predicates[t.predicate]
        subject = entity(t.subject, schema.subject_type)
        obj = entity(t.object, schema.object_type)
        triples.append(Triple(subject, schema.predicate, obj))
    return list(made.values()), triples


@dataclass(frozen=True)
class OutputHeads:
    """What ``model.json`` makes of one output tensor: its ``role``, the number of ``heads`` (axis 1
    of ``(batch, heads, length, length)``) it must have and ``why``, and the ``fix`` when it has
    not."""

    role: str
    heads: int
    why: str
    fix: str


def _label_name(label: PredicateSchema | str) -> str:
    return label if isinstance(label, str) else label.predicate


def _label_document(label: PredicateSchema | str) -> Any:
    return label if isinstance(label, str) else label.to_dict()


class Task(StrEnum):
    """A task: its output roles (``outputs``, in model output order), the ``model.json`` field that
    lists its labels (``labels_field``, also the ``Manifest`` attribute holding them) and its
    decoder. Members are their ``model.json`` names."""

    outputs: tuple[str, ...]
    labels_field: str
    decoder: Decoder

    def __new__(
        cls, name: str, outputs: tuple[str, ...], labels_field: str, decoder: Decoder
    ) -> Task:
        member = str.__new__(cls, name)
        member._value_ = name
        member.outputs = outputs
        member.labels_field = labels_field
        member.decoder = decoder
        return member

    TRIPLES = ("triples", ("entity", "head", "tail"), "predicates", _decode_triples)
    ENTITIES = ("entities", ("entities",), "entity_types", _decode_entities)

    @property
    def n_outputs(self) -> int:
        """How many output tensors a model of this task has (``len(outputs)``)."""
        return len(self.outputs)

    def labels(self, model: Labelled) -> tuple[PredicateSchema | str, ...]:
        """The labels of ``model`` in head order."""
        labels: tuple[PredicateSchema | str, ...] = getattr(model, self.labels_field)
        return labels

    def label_names(self, model: Labelled) -> tuple[str, ...]:
        """Head labels by name: predicates (triples) or entity types (entities)."""
        return tuple(_label_name(label) for label in self.labels(model))

    def output_heads(self, model: Labelled) -> tuple[OutputHeads, ...]:
        """The heads each output must have, in role order: GPLinker's ``entity`` output two (subject
        and object), every other output one per label of ``model``, in its order."""
        count = len(self.labels(model))
        label = self.labels_field.removesuffix("s").replace("_", " ")
        in_order = f"model.json must list the outputs in role order ({', '.join(self.outputs)})"
        all_labels = f"model.json must list all the model's {label}s, in its output order"
        return tuple(
            OutputHeads(role, 2, "subject and object", in_order)
            if role == "entity"
            else OutputHeads(role, count, f"one per {label} in model.json", all_labels)
            for role in self.outputs
        )

    def labels_document(self, labels: Sequence[PredicateSchema | str]) -> list[Any]:
        """``labels`` as ``model.json`` (and ``GET /v1/model``) write them."""
        return [_label_document(label) for label in labels]

    def decode(
        self,
        outputs: Sequence[FloatArray],
        n_tokens: int,
        threshold: float,
        model: Labelled,
        span: SpanOf,
    ) -> tuple[list[Entity], list[Triple]]:
        """Entities and triples of one window's ``outputs`` (one row of each, in role order)."""
        return self.decoder(outputs, n_tokens, threshold, model, span)


TASK_NAMES = tuple(t.value for t in Task)
_BY_NAME = {t.value: t for t in Task}


def task_named(name: str) -> Task:
    """The task written ``name`` in ``model.json``; ``ValueError`` naming the known ones if none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"expected one of {', '.join(TASK_NAMES)}, got {name!r}") from None
