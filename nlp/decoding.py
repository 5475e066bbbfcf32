"""GlobalPointer outputs -> token spans. Pure numpy; no TensorFlow.

Positions are indices into the model input row: ``0`` is ``[CLS]``, ``1..n_tokens`` are the text's
tokens, ``n_tokens + 1`` is ``[SEP]`` and everything after is padding. Only ``1..n_tokens`` may start or
end a span, whatever the bucket the row was padded to (dropping "positions 0 and -1", as the bert4keras
example does, keeps ``[SEP]`` and the padding once inputs are padded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.floating]

SUBJECT, OBJECT = 0, 1

# How a (subject, object) pair is linked by a predicate (``model.json``'s ``link_rule``): ``both``
# (bert4keras's GPLinker example: head-head and tail-tail each above the threshold) or ``mean`` (their
# mean above it: a sure link at one end carries a doubtful one at the other).
LINK_RULES = ("both", "mean")

# How many links a predicate may make in a window (``model.json``'s ``predicates[].cardinality``),
# read as "many subjects to one object": ``many_to_one`` gives each subject at most one object (出生日期:
# a person is born once), ``one_to_many`` each object at most one subject, ``one_to_one`` both (首都:
# a country has one capital, a city is the capital of one country), ``many_to_many`` no limit (the
# default: 主演). Where the linker finds more, the links it scores highest are kept: in parallel
# statements (A的首都是X，B的首都是Y) the crossed pairs (A, Y) and (B, X) also clear the threshold.
CARDINALITIES = ("many_to_many", "many_to_one", "one_to_many", "one_to_one")


@dataclass(frozen=True, order=True)
class TokenTriple:
    """A triple in token positions (inclusive ``head``/``tail`` of each argument)."""

    subject: tuple[int, int]
    predicate: int
    object: tuple[int, int]


@dataclass(frozen=True, order=True)
class TokenEntity:
    span: tuple[int, int]
    label: int


def _valid(logits: FloatArray, n_tokens: int) -> FloatArray:
    """The real-token block of ``(heads, L, L)`` logits: rows/cols ``1..n_tokens``, upper triangle kept,
    all else set to -inf. Returns a view-sized copy ``(heads, n_tokens, n_tokens)``."""
    if logits.ndim != 3 or logits.shape[1] != logits.shape[2]:
        raise ValueError(f"expected (heads, L, L) logits, got shape {logits.shape}")
    if not 0 <= n_tokens <= logits.shape[1] - 2:
        raise ValueError(f"{n_tokens} tokens do not fit a row of length {logits.shape[1]}")
    block = np.array(logits[:, 1 : n_tokens + 1, 1 : n_tokens + 1], dtype=np.float32)
    block[:, np.tril_indices(n_tokens, -1)[0], np.tril_indices(n_tokens, -1)[1]] = -np.inf
    return block


def decode_spans(logits: FloatArray, n_tokens: int, threshold: float) -> list[TokenEntity]:
    """Typed GlobalPointer decode: every (label, head, tail) scoring above ``threshold``."""
    block = _valid(logits, n_tokens)
    labels, heads, tails = np.nonzero(block > threshold)
    return sorted(
        TokenEntity((int(h) + 1, int(t) + 1), int(label))
        for label, h, t in zip(labels, heads, tails, strict=True)
    )


def decode_triples(
    entity_logits: FloatArray,
    head_logits: FloatArray,
    tail_logits: FloatArray,
    n_tokens: int,
    threshold: float,
    link_rule: str = "both",
    cardinality: Sequence[str] = (),
) -> list[TokenTriple]:
    """GPLinker: subjects and objects from the entity matrix (spans above ``threshold``); a (subject,
    object) pair gets predicate ``p`` by its scores at (subject head, object head) in the head-head
    matrix and at (subject tail, object tail) in the tail-tail matrix: with ``link_rule`` ``both``,
    when each is above ``threshold``; with ``mean``, when their mean is.

    ``cardinality`` (one of ``CARDINALITIES`` per predicate; empty: ``many_to_many`` for all) then
    limits each predicate's links: taken best first (the lower of the two scores for ``both``, their
    mean for ``mean``), a link is dropped when its subject already has its one object, or its
    object its one subject.

    >>> e = np.full((2, 4, 4), -9.0); e[0, 1, 1] = e[1, 2, 2] = 5.0
    >>> h = np.full((1, 4, 4), 3.0); t = np.full((1, 4, 4), -1.0)
    >>> decode_triples(e, h, t, 2, 0.0), decode_triples(e, h, t, 2, 0.0, "mean")
    ([], [TokenTriple(subject=(1, 1), predicate=0, object=(2, 2))])

    Two subjects (tokens 1, 2) and two objects (3, 4), all four pairs linked, the straight ones best:

    >>> e = np.full((2, 6, 6), -9.0); e[0, 1, 1] = e[0, 2, 2] = e[1, 3, 3] = e[1, 4, 4] = 5.0
    >>> h = np.full((1, 6, 6), 1.0); h[0, 1, 3] = h[0, 2, 4] = 4.0; t = h.copy()
    >>> [(x.subject[0], x.object[0]) for x in decode_triples(e, h, t, 4, 0.0)]
    [(1, 3), (1, 4), (2, 3), (2, 4)]
    >>> [(x.subject[0], x.object[0]) for x in decode_triples(e, h, t, 4, 0.0, "both", ["one_to_one"])]
    [(1, 3), (2, 4)]
    """
    if link_rule not in LINK_RULES:
        raise ValueError(f"link_rule must be one of {', '.join(LINK_RULES)}, got {link_rule!r}")
    unknown = sorted(set(cardinality) - set(CARDINALITIES))
    if unknown:
        raise ValueError(
            f"cardinality must be one of {', '.join(CARDINALITIES)}, got {unknown[0]!r}"
        )
    if cardinality and len(cardinality) != head_logits.shape[0]:
        raise ValueError(f"{len(cardinality)} cardinalities for {head_logits.shape[0]} predicates")
    if entity_logits.shape[0] != 2:
        raise ValueError(
            f"the entity matrix needs 2 heads (subject, object), got {entity_logits.shape}"
        )
    if head_logits.shape != tail_logits.shape or head_logits.shape[1:] != entity_logits.shape[1:]:
        raise ValueError(
            f"mismatched GPLinker outputs: {entity_logits.shape}, {head_logits.shape}, "
            f"{tail_logits.shape}"
        )
    spans = decode_spans(entity_logits, n_tokens, threshold)
    subjects = np.array([e.span for e in spans if e.label == SUBJECT], dtype=np.int64).reshape(
        -1, 2
    )
    objects = np.array([e.span for e in spans if e.label == OBJECT], dtype=np.int64).reshape(-1, 2)
    if not len(subjects) or not len(objects):
        return []
    # (P, S, O): predicate scores for every subject/object pair, from both matrices.
    hh = head_logits[:, subjects[:, 0][:, None], objects[:, 0][None, :]]
    tt = tail_logits[:, subjects[:, 1][:, None], objects[:, 1][None, :]]
    score = np.minimum(hh, tt) if link_rule == "both" else (hh + tt) / 2
    links = [
        (int(p), int(s), int(o)) for p, s, o in zip(*np.nonzero(score > threshold), strict=True)
    ]
    if any(c != CARDINALITIES[0] for c in cardinality):
        links = _limited(links, score, cardinality)
    return sorted(
        TokenTriple(
            (int(subjects[s, 0]), int(subjects[s, 1])),
            p,
            (int(objects[o, 0]), int(objects[o, 1])),
        )
        for p, s, o in links
    )


def _limited(
    links: list[tuple[int, int, int]], score: FloatArray, cardinality: Sequence[str]
) -> list[tuple[int, int, int]]:
    """``links`` (predicate, subject, object) taken best first, each predicate's subjects and
    objects kept to one link where its ``cardinality`` says so; ties go to the earlier pair."""
    kept: list[tuple[int, int, int]] = []
    subject_taken: set[tuple[int, int]] = set()
    object_taken: set[tuple[int, int]] = set()
    for p, s, o in sorted(links, key=lambda link: (-float(score[link]), link)):
        one_object = cardinality[p] in ("many_to_one", "one_to_one")
        one_subject = cardinality[p] in ("one_to_many", "one_to_one")
        if (one_object and (p, s) in subject_taken) or (one_subject and (p, o) in object_taken):
            continue
        subject_taken.add((p, s))
        object_taken.add((p, o))
        kept.append((p, s, o))
    return kept
