"""GlobalPointer outputs -> token spans. Pure numpy; no TensorFlow.

Positions are indices into the model input row: ``0`` is ``[CLS]``, ``1..n_tokens`` are the text's
tokens, ``n_tokens + 1`` is ``[SEP]`` and everything after is padding. Only ``1..n_tokens`` may start or
end a span, whatever the bucket the row was padded to (dropping "positions 0 and -1", as the bert4keras
example does, keeps ``[SEP]`` and the padding once inputs are padded).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.floating]

SUBJECT, OBJECT = 0, 1

# How a (subject, object) pair is linked by a predicate (``model.json``'s ``link_rule``): ``both``
# (bert4keras's GPLinker example: head-head and tail-tail each above the threshold) or ``mean`` (their
# mean above it: a sure link at one end carries a doubtful one at the other).
LINK_RULES = ("both", "mean")


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
) -> list[TokenTriple]:
    """GPLinker: subjects and objects from the entity matrix (spans above ``threshold``); a (subject,
    object) pair gets predicate ``p`` by its scores at (subject head, object head) in the head-head
    matrix and at (subject tail, object tail) in the tail-tail matrix: with ``link_rule`` ``both``,
    when each is above ``threshold``; with ``mean``, when their mean is.

    >>> e = np.full((2, 4, 4), -9.0); e[0, 1, 1] = e[1, 2, 2] = 5.0
    >>> h = np.full((1, 4, 4), 3.0); t = np.full((1, 4, 4), -1.0)
    >>> decode_triples(e, h, t, 2, 0.0), decode_triples(e, h, t, 2, 0.0, "mean")
    ([], [TokenTriple(subject=(1, 1), predicate=0, object=(2, 2))])
    """
    if link_rule not in LINK_RULES:
        raise ValueError(f"link_rule must be one of {', '.join(LINK_RULES)}, got {link_rule!r}")
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
    linked = (hh > threshold) & (tt > threshold) if link_rule == "both" else hh + tt > 2 * threshold
    ps, si, oi = np.nonzero(linked)
    return sorted(
        TokenTriple(
            (int(subjects[s, 0]), int(subjects[s, 1])),
            int(p),
            (int(objects[o, 0]), int(objects[o, 1])),
        )
        for p, s, o in zip(ps, si, oi, strict=True)
    )
