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
