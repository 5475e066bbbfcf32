"""GPLinker decoding against a deliberately naive reference written from the algorithm's description."""

import doctest

import numpy as np
import pytest

from nlp import decoding
from nlp.decoding import TokenTriple, decode_spans, decode_triples


def naive_gplinker(entity, head, tail, threshold, link_rule="both"):
    """Reference for an UNPADDED row ([CLS] t1..tn [SEP]): loops, no vectorizing.

    Subjects are (h, t) with entity[0, h, t] > threshold, objects with entity[1, h, t] > threshold,
    excluding [CLS] (position 0) and [SEP] (the last position) and spans ending before they start.
    A triple (s, p, o) is kept when head[p, s_h, o_h] > threshold and tail[p, s_t, o_t] > threshold
    (link rule "both"), or when the mean of the two is above threshold (link rule "mean").
    """
    length = entity.shape[1]
    subjects, objects = [], []
    for label in range(2):
        for h in range(1, length - 1):
            for t in range(h, length - 1):
                if entity[label, h, t] > threshold:
                    (subjects if label == 0 else objects).append((h, t))
    found = set()
    for sh, st in subjects:
        for oh, ot in objects:
            for p in range(head.shape[0]):
                a, b = head[p, sh, oh], tail[p, st, ot]
                if (
                    a > threshold and b > threshold
                    if link_rule == "both"
                    else (a + b) / 2 > threshold
                ):
                    found.add(((sh, st), p, (oh, ot)))
    return found


def _as_set(triples):
    return {(t.subject, t.predicate, t.object) for t in triples}


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("threshold", [0.0, 1.0])
@pytest.mark.parametrize("link_rule", ["both", "mean"])
def test_decoding_matches_naive_reference_on_unpadded_rows(seed, threshold, link_rule):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    length, predicates = n + 2, int(rng.integers(1, 5))
    entity = rng.normal(-1.0, 1.5, (2, length, length))
    head = rng.normal(-0.5, 1.5, (predicates, length, length))
    tail = rng.normal(-0.5, 1.5, (predicates, length, length))
    ours = decode_triples(entity, head, tail, n, threshold, link_rule)
    assert _as_set(ours) == naive_gplinker(entity, head, tail, threshold, link_rule)
    assert ours == sorted(ours)


def test_decoding_ignores_cls_sep_and_padding_in_every_bucket():
    n = 3
    for length in (5, 8, 16):
        entity = np.full((2, length, length), -9.0)
        head = np.full((1, length, length), -9.0)
        tail = np.full((1, length, length), -9.0)
        entity[0, 1, 2] = entity[1, 3, 3] = 5.0
        head[0, 1, 3] = tail[0, 2, 3] = 5.0
        # high scores on [CLS], on the real [SEP] (position n + 1) and on padding must not count
        for pos in {0, n + 1, length - 1}:
            entity[:, pos, :] = entity[:, :, pos] = 9.0
            head[:, pos, :] = tail[:, :, pos] = 9.0
        assert decode_triples(entity, head, tail, n, 0.0) == [TokenTriple((1, 2), 0, (3, 3))]


def test_decoding_spans_are_upper_triangle_and_typed():
    logits = np.full((2, 6, 6), -1.0)
    logits[1, 2, 3] = 1.0
    logits[0, 3, 2] = 5.0  # tail before head: not a span
    found = decode_spans(logits, 4, 0.0)
    assert [(e.span, e.label) for e in found] == [((2, 3), 1)]


def test_decoding_rejects_mismatched_shapes():
    with pytest.raises(ValueError):
        decode_triples(np.zeros((2, 5, 5)), np.zeros((3, 5, 5)), np.zeros((2, 5, 5)), 3, 0.0)
    with pytest.raises(ValueError):
        decode_spans(np.zeros((2, 5, 5)), 4, 0.0)  # 4 tokens + [CLS] + [SEP] > 5


def test_decoding_mean_links_find_what_both_find_and_more():
    rng = np.random.default_rng(7)
    entity = rng.normal(0.0, 2.0, (2, 14, 14))
    head, tail = rng.normal(0.0, 2.0, (2, 3, 14, 14))
    both = _as_set(decode_triples(entity, head, tail, 12, 0.0, "both"))
    mean = _as_set(decode_triples(entity, head, tail, 12, 0.0, "mean"))
    assert both < mean


def test_decoding_refuses_an_unknown_link_rule():
    with pytest.raises(ValueError, match="link_rule must be one of both, mean, got 'max'"):
        decode_triples(np.zeros((2, 5, 5)), np.zeros((1, 5, 5)), np.zeros((1, 5, 5)), 3, 0.0, "max")


def test_decoding_doctests():
    assert doctest.testmod(decoding).failed == 0
