import dataclasses
import itertools
import random
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nlp.bucketing import pad_batch
from nlp.decoding import decode_triples
from nlp.errors import InvalidInput, TextTooLong
from nlp.manifest import load_manifest
from nlp.pipeline import Extractor, Window, plan_windows
from nlp.runtime import SessionRuntime
from tests.nlp.test_tokenization import EDGE_CASES

SENTENCES = [
    "周杰伦出生于台湾省新北市，他的妻子是昆凌。",
    "李安导演了电影卧虎藏龙，1954年10月23日生于台湾屏东。",
    "《平凡的世界》的作者是路遥，由北京十月文艺出版社出版。",
    "马云创立了阿里巴巴集团，总部位于杭州。",
]


@pytest.fixture(scope="module")
def extractor(triples_model_dir):
    ex = Extractor.load(triples_model_dir, intra_op_threads=1, inter_op_threads=1)
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def ner_extractor(entities_model_dir):
    ex = Extractor.load(entities_model_dir, intra_op_threads=1, inter_op_threads=1)
    yield ex
    ex.close()


def _triples(extraction):
    return {(t.subject.span, t.predicate, t.object.span) for t in extraction.triples}


def test_pipeline_fixture_model_finds_something(extractor, ner_extractor):
    """The parity tests below mean little on a model that finds nothing: make sure it does."""
    assert sum(len(extractor.extract(s).triples) for s in SENTENCES) > 0
    assert sum(len(ner_extractor.extract(s).entities) for s in SENTENCES) > 0


def test_pipeline_padding_into_any_bucket_and_row_gives_identical_triples(
    extractor, triples_model_dir
):
    """Unpadded reference run vs the same text in every length bucket and every batch row."""
    m = load_manifest(triples_model_dir)
    tok = extractor.tokenizer
    for text in SENTENCES:
        ids = [tok.cls_id, *tok.encode(text).token_ids, tok.sep_id]
        n = len(ids) - 2
        exact = SessionRuntime(
            triples_model_dir,
            shapes=[(1, len(ids))],
            input_names=m.input_names,
            output_names=m.output_names,
            n_outputs=3,
            vocab_size=tok.vocab_size,
        )
        arr = np.array([ids], dtype=np.int32)
        reference = {
            (t.subject, t.predicate, t.object)
            for t in decode_triples(
                *[o[0] for o in exact.run(arr, np.zeros_like(arr))], n, m.threshold
            )
        }
        exact.close()
        others = [[tok.cls_id, *tok.encode(s).token_ids, tok.sep_id] for s in SENTENCES]
        for batch, length in extractor.buckets.shapes():
            if length < len(ids):
                continue
            for row in range(batch):
                rows = [o[:length] for o in others[:batch]]
                rows = (rows * batch)[:batch]
                rows[row] = ids
                arr = pad_batch(rows, (batch, length))
                outputs = extractor.runtime.run(arr, np.zeros_like(arr))
                got = {
                    (t.subject, t.predicate, t.object)
                    for t in decode_triples(*[o[row] for o in outputs], n, m.threshold)
                }
                assert got == reference, (text, batch, length, row)


def test_pipeline_batch_results_follow_input_order(extractor):
    texts = [SENTENCES[i % 4] * (1 + i % 3) for i in range(11)]
    batch = extractor.extract_batch(texts)
    assert batch == [extractor.extract(t) for t in texts]


def test_pipeline_offsets_index_the_original_text(extractor, ner_extractor):
    # NUL is refused before extraction (test_pipeline_rejects_bad_texts_with_codes).
    for text in [*SENTENCES, *(t.replace("\x00", "") for t in EDGE_CASES.values())]:
        for ex in (extractor, ner_extractor):
            result = ex.extract(text)
            spans = [e.span for e in result.entities]
            spans += [a.span for t in result.triples for a in (t.subject, t.object)]
            for span in spans:
                assert text[span.start : span.end] == span.text


def test_pipeline_types_come_from_the_schema(extractor):
    schema = {p.predicate: p for p in extractor.manifest.predicates}
    for text in SENTENCES:
        for t in extractor.extract(text).triples:
            assert t.subject.type == schema[t.predicate].subject_type
            assert t.object.type == schema[t.predicate].object_type


def test_pipeline_long_texts_are_windowed_not_truncated(extractor):
    # CJK and punctuation only: one token per character, so a window's substring re-tokenizes to
    # exactly the window's tokens (a cut inside "1954" would not).
    text = "".join(s for s in SENTENCES if not any(c.isdigit() for c in s)) * 8
    enc = extractor.tokenizer.encode(text)
    windows = plan_windows(text, enc, 0, extractor.max_window_tokens, extractor.window_overlap)
    assert len(windows) > 3
    assert windows[0].start == 0 and windows[-1].stop == len(enc)
    for a, b in itertools.pairwise(windows):
        assert b.start < a.stop  # overlapping: nothing between windows is lost
        assert a.stop - a.start <= extractor.max_window_tokens
    # the result is exactly the union of each window's own extraction, shifted to text offsets
    result = extractor.extract(text)
    expected = set()
    for w in windows:
        start, stop = enc.offsets[w.start][0], enc.offsets[w.stop - 1][1]
        for t in extractor.extract(text[start:stop]).triples:
            expected.add((t.subject.span.start + start, t.predicate, t.object.span.start + start))
    got = {(t.subject.span.start, t.predicate, t.object.span.start) for t in result.triples}
    assert got == expected
    assert (
        max(t.object.span.end for t in result.triples) > enc.offsets[extractor.max_window_tokens][0]
    )


def test_pipeline_windows_prefer_sentence_ends():
    from nlp.tokenization import Encoding

    text = "甲乙丙。丁戊己庚辛壬癸子丑"
    spans = [(i, i + 1) for i in range(len(text))]
    enc = Encoding(list(range(len(text))), spans, spans)
    windows = plan_windows(text, enc, 0, max_tokens=6, overlap=2)
    assert windows[0] == Window(0, 0, 4)  # cut after 。 rather than at 6 tokens
    assert windows[-1].stop == len(text)


def test_pipeline_leak_guard_ops_constant_and_shapes_bucketed(triples_model_dir):
    """2,000 extractions of random lengths up to 3x the max length: the graph never grows and the
    session is only ever fed bucket shapes. (A raised threshold keeps the random model from decoding
    hundreds of triples per random text; the request path is the same.)"""
    extractor = Extractor.load(triples_model_dir, intra_op_threads=1, inter_op_threads=1)
    extractor.manifest = dataclasses.replace(extractor.manifest, threshold=3.0)
    rng = random.Random(0)
    alphabet = "".join(SENTENCES) + "abc 123😀\n"
    ops = extractor.runtime.graph_op_count
    max_chars = extractor.max_window_tokens * 3
    for _ in range(2000):
        n = rng.randint(1, max_chars)
        extractor.extract("".join(rng.choice(alphabet) for _ in range(n)))
    assert extractor.runtime.graph_op_count == ops == extractor.runtime.op_count
    assert extractor.runtime.shapes_fed <= set(extractor.buckets.shapes())
    assert len(extractor.runtime.shapes_fed) > 3
    extractor.close()


@pytest.mark.parametrize(
    ("text", "error", "code"),
    [
        (123, InvalidInput, "invalid_input"),
        (None, InvalidInput, "invalid_input"),
        ("好\ud800", InvalidInput, "invalid_input"),
        ("长" * 10_001, TextTooLong, "text_too_long"),
        ("a\x00b", InvalidInput, "invalid_input"),
    ],
)
def test_pipeline_rejects_bad_texts_with_codes(extractor, text, error, code):
    with pytest.raises(error) as info:
        extractor.extract(text)
    assert info.value.code == code and info.value.field == "text"


def test_pipeline_batch_errors_name_the_index_and_run_nothing(extractor):
    runs = extractor.runtime.runs
    with pytest.raises(InvalidInput) as info:
        extractor.extract_batch(["好", "ok", 7])
    assert info.value.field == "texts[2]"
    assert extractor.runtime.runs == runs


def test_pipeline_batch_of_one_string_is_refused_not_split_into_characters(extractor):
    runs = extractor.runtime.runs
    for one in ("马云创立了阿里巴巴", b"bytes"):
        with pytest.raises(InvalidInput, match="texts must be a list of texts, not one"):
            extractor.extract_batch(one)
    # Neither a mapping (its keys were the texts) nor a set (answers in an order no caller could
    # match), nor what is not a collection at all (a TypeError of Python's).
    for other, name in (
        ({"马云": 1}, "dict"),
        ({"马云", "路遥"}, "set"),
        (None, "NoneType"),
        (5, "int"),
    ):
        with pytest.raises(InvalidInput, match=f"texts must be a list of texts, not {name}$"):
            extractor.extract_batch(other)
    assert extractor.runtime.runs == runs
    assert len(extractor.extract_batch(("马云", "路遥"))) == 2  # any sequence of strings


def test_pipeline_a_closed_extractor_says_so(triples_model_dir):
    with Extractor.load(triples_model_dir, intra_op_threads=1) as ex:
        assert ex.extract("马云").to_dict() is not None
    with pytest.raises(RuntimeError, match="this Extractor is closed"):
        ex.extract("马云")


def test_pipeline_close_waits_for_the_call_in_flight(triples_model_dir):
    """Closed from another thread mid-run, TensorFlow cancelled the running call and its
    CancelledError reached the caller; now the call ends, and the run stops with our error."""
    import threading

    ex = Extractor.load(triples_model_dir, intra_op_threads=1)
    real_run, entered = ex.runtime.run, threading.Event()

    def slow_run(*args):
        entered.set()
        time.sleep(0.3)
        return real_run(*args)

    ex.runtime.run = slow_run
    outcome = []

    def extract():
        try:
            ex.extract_batch(["马云创立了阿里巴巴。" * 3] * 40)  # several model calls
            outcome.append("done")
        except Exception as exc:
            outcome.append(exc)

    worker = threading.Thread(target=extract)
    worker.start()
    assert entered.wait(10)
    ex.close()
    worker.join(30)
    (error,) = outcome
    assert isinstance(error, RuntimeError) and "closed while it ran" in str(error)


def test_pipeline_empty_and_blank_texts_give_empty_results(extractor):
    assert [r.to_dict() for r in extractor.extract_batch(["", "  \n", "\u200b\u3000"])] == [
        {"entities": [], "triples": []}
    ] * 3


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=300))
def test_pipeline_property_any_text_extracts_with_valid_offsets(ner_extractor, text):
    for entity in ner_extractor.extract(text).entities:
        assert text[entity.span.start : entity.span.end] == entity.span.text


# -- bounded work: Plan.tokens, max_tokens, deadlines (issue 12) --------------------------------------
def test_pipeline_plan_counts_every_window_with_cls_and_sep(extractor):
    long_text = "。".join(SENTENCES * 40)
    plan = extractor.plan([SENTENCES[0], long_text])
    assert len(plan.windows) > 2
    assert plan.tokens == sum(w.stop - w.start + 2 for w in plan.windows)
    short = extractor.plan([SENTENCES[0]], field="text")
    assert short.tokens == len(extractor.tokenizer.encode(SENTENCES[0])) + 2
    assert plan.tokens > len(extractor.tokenizer.encode(long_text)) + 2  # overlaps count twice


def test_pipeline_max_tokens_refuses_before_any_model_call(extractor, monkeypatch):
    from nlp.errors import RequestTooLarge

    calls = []
    monkeypatch.setattr(extractor.runtime, "run", lambda *a: calls.append(a))
    tokens = extractor.plan(SENTENCES).tokens
    with pytest.raises(RequestTooLarge) as info:
        extractor.extract_batch(SENTENCES, max_tokens=tokens - 1)
    assert (info.value.tokens, info.value.limit, info.value.code) == (
        tokens,
        tokens - 1,
        "request_too_large",
    )
    assert str(tokens) in info.value.message and str(tokens - 1) in info.value.message
    assert calls == []


def test_pipeline_deadline_is_checked_between_model_calls(extractor, monkeypatch):
    from nlp.errors import DeadlineExceeded

    texts = ["。".join(SENTENCES * 12)] * 3 + SENTENCES  # several bucket shapes
    plan = extractor.plan(texts)
    now = [0.0]
    real_run = extractor.runtime.run
    calls = []

    def slow_run(token_ids, segment_ids):
        calls.append(token_ids.shape)
        now[0] += 1.0  # each model call takes one (fake) second
        return real_run(token_ids, segment_ids)

    monkeypatch.setattr(extractor.runtime, "run", slow_run)
    with pytest.raises(DeadlineExceeded) as info:
        extractor.run(plan, deadline=2.0, clock=lambda: now[0])
    assert len(calls) == 2  # stopped before the third call, not after the last
    assert (info.value.done, info.value.code) == (2, "deadline_exceeded")
    assert info.value.total > 2
    calls.clear()
    now[0] = 0.0
    assert len(extractor.run(plan, deadline=100.0, clock=lambda: now[0])) == len(texts)
    with pytest.raises(DeadlineExceeded):
        extractor.run(plan, deadline=-1.0)  # already past: no model call at all


def test_pipeline_call_started_is_set_for_each_model_call_only(extractor, monkeypatch):
    """``call_started`` says when the model call running now began (a serving worker stops its
    heartbeat on one that runs too long), and is None between calls, after a failed one too."""
    import time

    seen = []
    real_run = extractor.runtime.run

    def run(token_ids, segment_ids):
        seen.append(extractor.call_started)
        if len(seen) == 2:
            raise RuntimeError("the runtime failed")
        return real_run(token_ids, segment_ids)

    monkeypatch.setattr(extractor.runtime, "run", run)
    assert extractor.call_started is None
    before = time.monotonic()
    extractor.extract_batch(SENTENCES[:1])
    with pytest.raises(RuntimeError, match="the runtime failed"):
        extractor.extract_batch(SENTENCES[1:2])
    assert len(seen) == 2 and all(t is not None and before <= t <= time.monotonic() for t in seen)
    assert extractor.call_started is None
