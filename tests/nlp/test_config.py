"""``nlp.config``: the load options and their checks, without TensorFlow (but for the one test that
compares a table here with the TF session's)."""

from __future__ import annotations

import pickle

import pytest

from nlp.config import (
    EXTRA_REWRITES,
    SHORT_CALL_PLANS,
    TF_SESSION_OPTIONS,
    LoadOptions,
    plan_sessions,
)


def test_config_load_options_default_to_no_tf_session_opt_ins():
    options = LoadOptions("m")
    assert options.short_call_threads is False and options.extra_rewrites == ()
    assert options.tf_session_options() == [] and options.problems() == []
    assert set(TF_SESSION_OPTIONS) <= {f for f in LoadOptions.__dataclass_fields__}


def test_config_unknown_rewrites_are_listed_with_the_known_ones():
    options = LoadOptions("m", extra_rewrites=("fuse_sibling_dense", "fuse_all", "qkv"))
    assert options.problems() == [
        "extra_rewrites must be among fuse_sibling_dense, got 'fuse_all', 'qkv'"
    ]
    # every problem at once, the others' too
    both = LoadOptions("m", precision="fp64", extra_rewrites=("qkv",)).problems()
    assert len(both) == 2 and both[0].startswith("precision must be one of")


def test_config_counts_are_integers_not_their_spellings():
    """``Extractor.load(d, intra_op_threads="2")`` (a value read from an environment) was a
    ``TypeError: '<' not supported between 'str' and 'int'``: now each is named, all at once."""
    bad = LoadOptions("m", intra_op_threads="2", max_text_chars=True, max_batch_tokens=0.5)  # type: ignore[arg-type]
    assert bad.problems() == [
        "max_text_chars must be a positive integer, got True",
        "intra_op_threads must be a positive integer (or None), got '2'",
        "max_batch_tokens must be a positive integer (or None), got 0.5",
    ]
    assert LoadOptions("m", intra_op_threads=2, max_batch_tokens=None).problems() == []


def test_config_extra_rewrites_given_as_a_string_or_a_list_are_a_tuple():
    assert LoadOptions("m", extra_rewrites="fuse_sibling_dense").extra_rewrites == (
        "fuse_sibling_dense",
    )
    options = LoadOptions("m", extra_rewrites=["fuse_sibling_dense"])  # type: ignore[arg-type]
    assert options.extra_rewrites == ("fuse_sibling_dense",)
    assert hash(options) == hash(LoadOptions("m", extra_rewrites=("fuse_sibling_dense",)))
    assert pickle.loads(pickle.dumps(options)) == options  # crosses the batch workers' spawn


def test_config_short_call_threads_need_the_plans_upper_bound():
    assert LoadOptions("m", short_call_threads=True).problems() == [
        "short_call_threads needs intra_op_threads (the thread plan's upper bound)"
    ]
    assert LoadOptions("m", short_call_threads=True, intra_op_threads=2).problems() == []


def test_config_thread_plan_is_the_measured_one_for_the_precision_when_asked():
    on = LoadOptions("m", short_call_threads=True, intra_op_threads=2)
    assert on.thread_plan("int8") == SHORT_CALL_PLANS["int8"] == ((128, 1),)
    assert on.thread_plan("bf16") == () and on.thread_plan("fp32") == ()  # none measured faster
    assert LoadOptions("m", intra_op_threads=2).thread_plan("int8") == ()  # off by default
    assert on.tf_session_options() == ["short_call_threads=on"]
    both = on.replace(extra_rewrites=("fuse_sibling_dense",))
    assert both.tf_session_options() == [
        "short_call_threads=on",
        "extra_rewrites=fuse_sibling_dense",
    ]


@pytest.mark.parametrize(
    ("plan", "threads", "sessions"),
    [
        (((128, 1),), 2, (1,)),
        (((128, 1),), 1, ()),  # every call already runs on one thread: no second session
        (((128, 1),), None, ()),  # TensorFlow's default: no bound, no plan
        (((16, 1), (64, 2), (128, 4)), 4, (1, 2)),  # 4 is the main session
        ((), 8, ()),
    ],
)
def test_config_plan_sessions_counts_the_sessions_below_the_bound(plan, threads, sessions):
    assert plan_sessions(plan, threads) == sessions


def test_config_extra_rewrites_are_the_tf_sessions_opt_in_rewrites():
    """The TF-free table the settings check names against is the TF session's own list."""
    from nlp.runtime import FROZEN_PRECISIONS
    from nlp.tf_graph import OPT_IN_REWRITES

    assert tuple(EXTRA_REWRITES) == tuple(OPT_IN_REWRITES)
    assert set(SHORT_CALL_PLANS) <= set(FROZEN_PRECISIONS)
