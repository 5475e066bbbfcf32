import numpy as np
import pytest

from nlp.bucketing import BucketSpec, pad_batch, plan_batches

SPEC = BucketSpec((16, 32, 64, 128), (1, 2, 4, 8, 16, 32), max_batch_tokens=1024)


@pytest.mark.parametrize("seed", range(5))
def test_bucketing_plan_covers_every_input_once_in_allowed_shapes(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 129, size=int(rng.integers(1, 300))).tolist()
    batches = plan_batches(lengths, SPEC)
    rows = [r for b in batches for r in b.rows]
    assert sorted(rows) == list(range(len(lengths)))
    allowed = set(SPEC.shapes())
    for b in batches:
        assert b.shape in allowed
        assert len(b.rows) <= b.shape[0]
        assert all(lengths[r] <= b.shape[1] for r in b.rows)
        # each input sits in the smallest length bucket that holds it
        assert all(SPEC.length_bucket(lengths[r]) == b.shape[1] for r in b.rows)


def test_bucketing_max_batch_tokens_caps_rows_but_keeps_one():
    spec = BucketSpec((16, 256), (1, 8, 32), max_batch_tokens=512)
    assert spec.batch_buckets_for(16) == (1, 8, 32)
    assert spec.batch_buckets_for(256) == (1,)
    assert (32, 256) not in spec.shapes()


def test_bucketing_remainders_use_smaller_buckets_without_padding_rows():
    batches = plan_batches([10] * 37, SPEC)
    assert [b.shape[0] for b in batches] == [32, 4, 1]
    assert sum(len(b.rows) for b in batches) == 37


def test_bucketing_pads_rows_when_no_bucket_fits_the_remainder():
    spec = BucketSpec((16,), (4, 8))
    batches = plan_batches([5, 6, 7], spec)
    assert [(b.shape, len(b.rows)) for b in batches] == [((4, 16), 3)]


def test_bucketing_rejects_inputs_longer_than_the_largest_bucket():
    with pytest.raises(ValueError, match="exceed"):
        plan_batches([129], SPEC)


def test_bucketing_pad_batch_left_aligns_and_pads():
    out = pad_batch([[2, 5, 3], [2, 3]], (4, 5), pad_id=0)
    assert out.shape == (4, 5) and out.dtype == np.int32
    assert out.tolist() == [[2, 5, 3, 0, 0], [2, 3, 0, 0, 0], [0] * 5, [0] * 5]
    with pytest.raises(ValueError):
        pad_batch([[1] * 6], (1, 5))


@pytest.mark.parametrize("bad", [(), (16, 8), (0, 16), (16, 16)])
def test_bucketing_spec_rejects_bad_buckets(bad):
    with pytest.raises(ValueError):
        BucketSpec(bad, (1,))


FINE = BucketSpec((16, 32, 64, 128), (1, 2, 4, 8), max_batch_tokens=1024, single_row_step=8)


def test_bucketing_single_rows_pad_to_the_step_and_are_warm_shapes():
    assert FINE.single_row_lengths == (
        16,
        24,
        32,
        40,
        48,
        56,
        64,
        72,
        80,
        88,
        96,
        104,
        112,
        120,
        128,
    )
    assert [FINE.single_row_length(n) for n in (3, 16, 17, 33, 121, 128)] == [
        16,
        16,
        24,
        40,
        128,
        128,
    ]
    shapes = FINE.shapes()
    assert len(shapes) == len(set(shapes))
    assert {(1, n) for n in FINE.single_row_lengths} <= set(shapes)
    # wider batches keep the coarse buckets only
    assert (2, 24) not in shapes and (2, 32) in shapes
    assert [b.shape for b in plan_batches([70], FINE)] == [(1, 72)]
    assert [b.shape for b in plan_batches([70, 75], FINE)] == [(2, 128)]


def test_bucketing_single_row_step_respects_odd_length_buckets():
    """A step multiple above the input's own length bucket is never chosen (20 < 24 here)."""
    spec = BucketSpec((12, 20, 40), (1, 4), single_row_step=8)
    assert spec.single_row_lengths == (12, 16, 20, 24, 32, 40)
    assert spec.single_row_length(19) == 20 and spec.single_row_length(21) == 24
    # without batch bucket 1 there are no one-row batches: nothing finer is warmed
    assert BucketSpec((12, 20), (2, 4), single_row_step=8).single_row_lengths == (12, 20)


@pytest.mark.parametrize("seed", range(5))
def test_bucketing_fine_plan_covers_every_input_in_warm_shapes(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 129, size=int(rng.integers(1, 60))).tolist()
    batches = plan_batches(lengths, FINE)
    assert sorted(r for b in batches for r in b.rows) == list(range(len(lengths)))
    allowed = set(FINE.shapes())
    for b in batches:
        assert b.shape in allowed
        assert all(lengths[r] <= b.shape[1] for r in b.rows)
        if b.shape[0] == 1:
            assert b.shape[1] - lengths[b.rows[0]] < 8


def test_bucketing_rejects_a_bad_single_row_step():
    with pytest.raises(ValueError, match="single_row_step"):
        BucketSpec((16,), (1,), single_row_step=0)
