"""``Extractor``: tokenize -> window -> bucket -> run -> decode -> merge, for one text or many.

Texts longer than the model's max length are split into overlapping token windows (cut, where
possible, after a sentence end: 。！？；!?; or a line break), each window is decoded, and the results are
merged in original-text offsets with duplicates removed: nothing is silently truncated. Every text is
checked first by ``nlp.validation.check_text`` (texts over ``max_text_chars`` characters, NUL, lone
surrogates are refused). The model call goes through a ``nlp.protocols.Runtime``: ``SessionRuntime``
unless the caller builds the ``Extractor`` around another.

One flow per request: the edge (REST, batch, Spark) calls ``plan`` once per request or text; it checks
and tokenizes each text exactly once and windows it, without touching the model (pure, safe from any
thread). ``Plan.merge`` joins plans (the micro-batcher's combined call, a batch chunk) without
re-reading a text, and ``run`` runs a plan, so nothing downstream validates or tokenizes again.

Work is bounded in two ways, both optional. ``Plan.tokens`` counts the request's work: every window's
tokens plus its ``[CLS]`` and ``[SEP]`` (overlaps count twice: the model runs them twice). ``plan`` with
``max_tokens`` (the one token cap: ``SPO_MAX_REQUEST_TOKENS`` on the service) refuses a plan over it
with ``RequestTooLarge`` before any model call. ``run`` with a ``deadline`` (a ``time.monotonic()``
value) checks it before every model call and stops with ``DeadlineExceeded``: a deadline can be
overshot by at most one model call (one bucket-shaped batch).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nlp.bucketing import BucketSpec, pad_batch, plan_batches
from nlp.config import DEFAULT_MAX_TEXT_CHARS, LoadOptions
from nlp.errors import DeadlineExceeded, InvalidInput, RequestTooLarge
from nlp.manifest import Manifest, load_manifest
from nlp.protocols import Runtime
from nlp.runtime import SessionRuntime
from nlp.tokenization import Encoding, Tokenizer
from nlp.validation import check_text
from nlp.values import Entity, Extraction, Span, Triple

logger = logging.getLogger(__name__)

SENTENCE_ENDS = frozenset("。！？；!?;\n\r")


@dataclass(frozen=True)
class Window:
    """Tokens ``[start, stop)`` of text ``text_index``."""

    text_index: int
    start: int
    stop: int


@dataclass(frozen=True)
class Plan:
    """Validated texts, their encodings and windows: everything before the model. See ``tokens``.

    ``len(plan)`` is its number of texts; ``run`` returns one ``Extraction`` per text, in order.
    """

    texts: tuple[str, ...]
    encodings: tuple[Encoding, ...]
    windows: tuple[Window, ...]

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def tokens(self) -> int:
        """The model tokens this plan runs: each window with its ``[CLS]`` and ``[SEP]``."""
        return sum(w.stop - w.start + 2 for w in self.windows)

    @classmethod
    def merge(cls, plans: Sequence[Plan]) -> Plan:
        """One plan running ``plans`` together: their texts in order, windows renumbered. Nothing is
        checked or tokenized again; ``run``'s results split back by ``len`` of each plan."""
        if len(plans) == 1:
            return plans[0]
        windows: list[Window] = []
        base = 0
        for plan in plans:
            windows.extend(Window(w.text_index + base, w.start, w.stop) for w in plan.windows)
            base += len(plan.texts)
        return cls(
            tuple(t for p in plans for t in p.texts),
            tuple(e for p in plans for e in p.encodings),
            tuple(windows),
        )


@dataclass(frozen=True)
class ModelCall:
    """One ``SessionRuntime.run``: its bucket ``shape`` (batch, length), the ``rows`` that held
    windows, the ``tokens`` they held ([CLS] and [SEP] included) and how long it took."""

    shape: tuple[int, int]
    rows: int
    tokens: int
    seconds: float

    @property
    def padded_tokens(self) -> int:
        """Pad positions the model computed for nothing (``batch * length - tokens``)."""
        return self.shape[0] * self.shape[1] - self.tokens


@dataclass(frozen=True)
class BatchReport:
    """What one ``run`` (or ``extract_batch``) did: ``texts`` in, ``tokens`` (per text, without [CLS]/[SEP])
    and the model ``calls`` that ran them. Observers get one per call (``Extractor.observers``)."""

    texts: int
    text_tokens: tuple[int, ...]
    calls: tuple[ModelCall, ...]

    @property
    def tokens(self) -> int:
        return sum(self.text_tokens)


BatchObserver = Callable[[BatchReport], None]


def plan_windows(
    text: str, encoding: Encoding, text_index: int, max_tokens: int, overlap: int
) -> list[Window]:
    """Token windows of at most ``max_tokens`` covering the whole encoding, consecutive windows sharing
    up to ``overlap`` tokens; cuts prefer a sentence end in the second half of a window."""
    n = len(encoding)
    if n <= max_tokens:
        return [Window(text_index, 0, n)]
    offsets = encoding.offsets

    def boundary(k: int) -> bool:
        """A sentence ends between token ``k - 1`` and token ``k``."""
        end = offsets[k - 1][1]
        gap = text[end : offsets[k][0]] if k < n else ""
        return text[end - 1] in SENTENCE_ENDS or any(c in SENTENCE_ENDS for c in gap)

    windows: list[Window] = []
    start = 0
    while True:
        stop = start + max_tokens
        if stop >= n:
            windows.append(Window(text_index, start, n))
            return windows
        cut = next((k for k in range(stop, start + max_tokens // 2, -1) if boundary(k)), stop)
        windows.append(Window(text_index, start, cut))
        # The next window starts at the earliest sentence start within the overlap, if any.
        low = max(cut - overlap, start + 1)
        start = next((k for k in range(low, cut) if boundary(k)), low)


def _entity_key(e: Entity) -> tuple[int, int, str]:
    return (e.span.start, e.span.end, e.type)


def _triple_key(t: Triple) -> tuple[int, int, int, int, str]:
    s, o = t.subject.span, t.object.span
    return (s.start, s.end, o.start, o.end, t.predicate)


class Extractor:
    """Entities and triples from Chinese text with one model directory. Not thread-safe."""

    def __init__(
        self,
        manifest: Manifest,
        tokenizer: Tokenizer,
        runtime: Runtime,
        *,
        max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
        buckets: BucketSpec,
        window_overlap: int | None = None,
    ) -> None:
        self.manifest = manifest
        self.tokenizer = tokenizer
        self.runtime = runtime
        self.max_text_chars = max_text_chars
        self.buckets = buckets
        self.max_window_tokens = buckets.max_length - 2
        self.window_overlap = (
            window_overlap if window_overlap is not None else self.max_window_tokens // 4
        )
        # Called with a ``BatchReport`` after each successful ``run`` (metrics, logs).
        self.observers: list[BatchObserver] = []
        self.closed = False
        self._calling = threading.Lock()  # held by each model call, and by close()
        # When the model call running now began (``time.monotonic()``), None between calls: one
        # bucket-shaped batch, the one step no deadline can interrupt (a serving worker's heartbeat
        # reads it: ``deploy/gunicorn.conf.py``).
        self.call_started: float | None = None

    @classmethod
    def load(cls, options: LoadOptions | str | Path, /, **changes: Any) -> Extractor:
        """Validate the model directory, load the SavedModel, warm every bucket shape.

        ``options``: a ``LoadOptions``, or a model directory; ``changes`` replace ``LoadOptions``
        fields (``Extractor.load("models/demo", precision="bf16")``). ``nlp.loader.load_extractor`` is
        the same, importable without TensorFlow.
        """
        if not isinstance(options, LoadOptions):
            options = LoadOptions(Path(options))
        options = options.replace(**changes) if changes else options
        problems = options.problems()
        if problems:
            raise ValueError("; ".join(problems))
        manifest = load_manifest(options.model_dir)
        options = options.resolve_precision(manifest.precision)
        assert options.precision is not None
        manifest.check_precision(options.precision)
        tokenizer = Tokenizer.from_file(manifest.vocab_path, do_lower_case=manifest.do_lower_case)
        buckets = BucketSpec(
            manifest.length_buckets,
            manifest.batch_buckets,
            options.max_batch_tokens,
            single_row_step=manifest.single_row_length_step,
        )
        runtime: Runtime
        if manifest.engine == "openvino":
            # A directory written by `spo export-openvino`: the opt-in OpenVINO engine.
            from nlp.openvino_runtime import OpenVinoRuntime

            runtime = OpenVinoRuntime.for_model(
                manifest, options, shapes=buckets.shapes(), vocab_size=tokenizer.vocab_size
            )
        elif manifest.engine_spec is not None:
            # A directory written by `spo export-onnx`: the opt-in ONNX Runtime engine.
            from nlp.onnx_runtime import OnnxRuntime

            runtime = OnnxRuntime.for_model(
                manifest, options, shapes=buckets.shapes(), vocab_size=tokenizer.vocab_size
            )
        else:
            runtime = SessionRuntime.for_model(
                manifest, options, shapes=buckets.shapes(), vocab_size=tokenizer.vocab_size
            )
        return cls(
            manifest, tokenizer, runtime, max_text_chars=options.max_text_chars, buckets=buckets
        )

    # -- extraction ------------------------------------------------------------------------------
    def extract(self, text: str) -> Extraction:
        return self.extract_batch([text], field="text")[0]

    def plan(
        self,
        texts: Sequence[object],
        *,
        field: str = "texts",
        max_tokens: int | None = None,
        max_text_chars: int | None = None,
    ) -> Plan:
        """Check every text (``nlp.validation.check_text`` against ``max_text_chars``, by default the
        extractor's; the field is ``texts[i]`` when ``field`` is ``"texts"``, else ``field``), then
        tokenize and window each once; no model call (safe from any thread). Over ``max_tokens``
        model tokens: ``RequestTooLarge``, the one token cap."""
        if isinstance(texts, (str, bytes)):  # a sequence too, of characters: extract() takes one
            raise InvalidInput(
                f"{field} must be a list of texts, not one {type(texts).__name__}", field=field
            )
        # A mapping would give its keys, a set an order no answer could be matched to.
        if isinstance(texts, (Mapping, AbstractSet)) or not isinstance(texts, Iterable):
            raise InvalidInput(
                f"{field} must be a list of texts, not {type(texts).__name__}", field=field
            )
        limit = self.max_text_chars if max_text_chars is None else max_text_chars
        checked = [
            check_text(text, limit, f"{field}[{i}]" if field == "texts" else field)
            for i, text in enumerate(texts)
        ]
        encodings = tuple(self.tokenizer.encode(t) for t in checked)
        windows = tuple(
            w
            for i, (t, e) in enumerate(zip(checked, encodings, strict=True))
            for w in plan_windows(t, e, i, self.max_window_tokens, self.window_overlap)
            if w.stop > w.start
        )
        plan = Plan(tuple(checked), encodings, windows)
        if max_tokens is not None and plan.tokens > max_tokens:
            raise RequestTooLarge(plan.tokens, max_tokens, field=field)
        return plan

    def extract_batch(
        self,
        texts: Sequence[str],
        *,
        field: str = "texts",
        max_tokens: int | None = None,
        deadline: float | None = None,
    ) -> list[Extraction]:
        """``run(plan(texts, ...))``: one ``Extraction`` per text, in input order (see ``plan`` and
        ``run`` for the checks, the token cap and the deadline)."""
        return self.run(self.plan(texts, field=field, max_tokens=max_tokens), deadline=deadline)

    def run(
        self,
        plan: Plan,
        *,
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> list[Extraction]:
        """Run ``plan`` through the model, bucket by bucket; checks ``deadline`` before each call."""
        if self.closed:
            raise RuntimeError("this Extractor is closed: load another")
        texts, encodings, windows = plan.texts, plan.encodings, plan.windows
        entities: list[set[Entity]] = [set() for _ in texts]
        triples: list[set[Triple]] = [set() for _ in texts]
        tok = self.tokenizer
        calls: list[ModelCall] = []
        batches = plan_batches([w.stop - w.start + 2 for w in windows], self.buckets)
        for done, batch in enumerate(batches):
            if deadline is not None and clock() >= deadline:
                raise DeadlineExceeded(
                    f"stopped at its deadline after {done} of {len(batches)} model calls",
                    done=done,
                    total=len(batches),
                )
            rows = [windows[r] for r in batch.rows]
            sequences = [
                [tok.cls_id, *encodings[w.text_index].token_ids[w.start : w.stop], tok.sep_id]
                for w in rows
            ]
            token_ids = pad_batch(sequences, batch.shape, pad_id=tok.pad_id)
            started = time.perf_counter()
            with self._calling:  # close() waits for the call in flight, then this run stops
                if self.closed:
                    raise RuntimeError("this Extractor was closed while it ran: load another")
                self.call_started = time.monotonic()
                try:
                    outputs = self.runtime.run(token_ids, np.zeros_like(token_ids))
                finally:
                    self.call_started = None
            seconds = time.perf_counter() - started
            calls.append(ModelCall(batch.shape, len(rows), sum(map(len, sequences)), seconds))
            for r, window in enumerate(rows):
                self._collect([o[r] for o in outputs], window, texts, encodings, entities, triples)
        if self.observers:
            report = BatchReport(len(texts), tuple(len(e) for e in encodings), tuple(calls))
            for observe in self.observers:
                try:
                    observe(report)
                except Exception:  # an observer (metrics, logs) never fails an extraction
                    logger.exception("batch observer %r failed", observe)
        return [
            Extraction(
                entities=tuple(sorted(e, key=_entity_key)),
                triples=tuple(sorted(t, key=_triple_key)),
            )
            for e, t in zip(entities, triples, strict=True)
        ]

    def _span(self, text: str, encoding: Encoding, window: Window, head: int, tail: int) -> Span:
        """Character span of window tokens ``head..tail`` (row positions, ``[CLS]`` = 0): the whole
        words they touch (``Encoding.words``)."""
        start = encoding.words[window.start + head - 1][0]
        end = encoding.words[window.start + tail - 1][1]
        return Span(start, end, text[start:end])

    def _collect(
        self,
        outputs: list[Any],
        window: Window,
        texts: Sequence[str],
        encodings: Sequence[Encoding],
        entities: list[set[Entity]],
        triples: list[set[Triple]],
    ) -> None:
        i = window.text_index
        text, encoding = texts[i], encodings[i]
        found_entities, found_triples = self.manifest.task.decode(
            outputs,
            window.stop - window.start,
            self.manifest.threshold,
            self.manifest,
            lambda head, tail: self._span(text, encoding, window, head, tail),
        )
        entities[i].update(found_entities)
        triples[i].update(found_triples)

    def close(self) -> None:
        """Free the model; a model call running in another thread ends first (TensorFlow cancelled
        it, and its error reached that thread), and that thread's run then stops."""
        with self._calling:
            self.closed = True
            self.runtime.close()

    def __enter__(self) -> Extractor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
