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


def naive_limited(entity, head, tail, threshold, link_rule, cardinality):
    """Reference for ``cardinality``: of the links found, repeatedly take the best remaining one (ties:
    the smallest (predicate, subject, object)) and strike every remaining link it rules out."""
    left = naive_gplinker(entity, head, tail, threshold, link_rule)

    def score(link):
        (sh, st), p, (oh, ot) = link
        a, b = head[p, sh, oh], tail[p, st, ot]
        return min(a, b) if link_rule == "both" else (a + b) / 2

    kept = set()
    while left:
        best = min(left, key=lambda link: (-score(link), link))
        kept.add(best)
        subject, p, obj = best
        c = cardinality[p]
        left = {
            link
            for link in left - {best}
            if not (
                link[1] == p
                and (
                    (c in ("many_to_one", "one_to_one") and link[0] == subject)
                    or (c in ("one_to_many", "one_to_one") and link[2] == obj)
                )
            )
        }
    return kept


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("link_rule", ["both", "mean"])
def test_decoding_cardinality_matches_naive_reference(seed, link_rule):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(2, 12))
    length = n + 2
    entity = rng.normal(0.5, 1.5, (2, length, length))
    head = rng.normal(0.5, 1.5, (len(decoding.CARDINALITIES), length, length))
    tail = rng.normal(0.5, 1.5, (len(decoding.CARDINALITIES), length, length))
    cardinality = list(decoding.CARDINALITIES)
    ours = decode_triples(entity, head, tail, n, 0.0, link_rule, cardinality)
    assert _as_set(ours) == naive_limited(entity, head, tail, 0.0, link_rule, cardinality)
    unlimited = decode_triples(entity, head, tail, n, 0.0, link_rule)
    assert _as_set(ours) <= _as_set(unlimited)
    assert decode_triples(entity, head, tail, n, 0.0, link_rule, ["many_to_many"] * 4) == unlimited


def _parallel_statements():
    """Subjects at tokens 1 and 2, objects at 3 and 4 (A的首都是X，B的首都是Y): every pair links, the
    straight pairs (1, 3) and (2, 4) best; token 2 also links to 3 better than 1 does."""
    entity = np.full((2, 6, 6), -9.0)
    entity[0, 1, 1] = entity[0, 2, 2] = entity[1, 3, 3] = entity[1, 4, 4] = 5.0
    head = np.full((1, 6, 6), 1.0)
    head[0, 1, 3] = head[0, 2, 4] = 4.0
    head[0, 2, 3] = 2.0
    return entity, head, head.copy()


@pytest.mark.parametrize(
    ("cardinality", "pairs"),
    [
        ("many_to_many", [(1, 3), (1, 4), (2, 3), (2, 4)]),
        ("many_to_one", [(1, 3), (2, 4)]),  # each subject its best object
        ("one_to_many", [(1, 3), (2, 4)]),  # each object its best subject
        ("one_to_one", [(1, 3), (2, 4)]),
    ],
)
def test_decoding_cardinality_keeps_the_best_links(cardinality, pairs):
    entity, head, tail = _parallel_statements()
    found = decode_triples(entity, head, tail, 4, 0.0, "both", [cardinality])
    assert [(t.subject[0], t.object[0]) for t in found] == pairs


def test_decoding_a_limited_side_leaves_the_other_side_free():
    entity, head, tail = _parallel_statements()
    head[0, 2, 4] = tail[0, 2, 4] = 0.5  # token 2's own object is now its weakest
    found = decode_triples(entity, head, tail, 4, 0.0, "both", ["many_to_one"])
    assert [(t.subject[0], t.object[0]) for t in found] == [(1, 3), (2, 3)]  # 3 twice: allowed
    found = decode_triples(entity, head, tail, 4, 0.0, "both", ["one_to_one"])
    assert [(t.subject[0], t.object[0]) for t in found] == [(1, 3), (2, 4)]


def test_decoding_refuses_an_unknown_cardinality_or_a_wrong_count():
    e, h = np.zeros((2, 5, 5)), np.zeros((1, 5, 5))
    with pytest.raises(ValueError, match=r"cardinality must be one of many_to_many, .*'one'"):
        decode_triples(e, h, h, 3, 0.0, "both", ["one"])
    with pytest.raises(ValueError, match="2 cardinalities for 1 predicates"):
        decode_triples(e, h, h, 3, 0.0, "both", ["one_to_one", "one_to_one"])


def test_decoding_doctests():
    assert doctest.testmod(decoding).failed == 0
