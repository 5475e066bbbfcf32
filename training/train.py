"""Train a GPLinker triples model or a GlobalPointer NER model (bert4keras, random init) and write a
model directory.

Task ``triples`` is the bert4keras GPLinker example: one entity GlobalPointer (subject, object), two
predicate GlobalPointers (head-head, tail-tail), trained with the sparse multilabel categorical
crossentropy on all three outputs. Task ``entities`` is a typed GlobalPointer (one head per entity
type of ``training.schema.ENTITY_TYPES``) trained with the same loss on the corpus's entity mentions
(every occurrence of each named entity). Labels are aligned to the token offsets of ``nlp.tokenization``,
the same tokenizer the server uses. Inputs come in a few fixed lengths so the graph is traced a few
times only. With ``max_steps`` the run is exactly that many steps (the learning-rate schedule spans
them and epochs repeat as needed), so a rerun with the same seed does the same work on any machine;
without it, training runs ``epochs``. ``max_minutes`` is only a safety net (``stopped_early`` in
``training.json`` says it fired). The settings and their defaults are ``training.config.TrainConfig``;
the command line is ``spo train`` (``app/cli/model.py``)::

    spo train data/train.jsonl --out models/demo --max-steps 3000 --seed 1
    spo train data/train.jsonl --task entities --out models/ner --max-steps 1200 --seed 1
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nlp  # noqa: F401  (sets TF_KERAS before TensorFlow loads)
from nlp.manifest import VOCAB_NAME, manifest_document, sha256_file
from nlp.tasks import Task, task_named
from nlp.tokenization import Tokenizer
from training.config import DEFAULT_NAMES, TrainConfig
from training.conversion import replaceable
from training.evaluate import DataError, labels_check, read_records
from training.schema import ENTITY_TYPES, entity_spans, schema_documents, triple_entities

logger = logging.getLogger(__name__)

TRAIN_LENGTHS = (32, 64, 96, 128)
# With ``TrainConfig.xla`` every batch shape is compiled once, so finer lengths cost a compile each
# (about 20 s on 2 CPU cores) and save padding on every step: a step's cost grows faster than its
# length (the GlobalPointer scores are length x length), and the XLA step at 48 tokens takes 0.6 of
# the one at 64 (bench figures in docs/training.md).
XLA_LENGTHS = (16, 32, 48, 64, 80, 96, 112, 128)
MAX_ENTITY_LABELS = 16
MAX_PAIR_LABELS = 8
# The label arrays of the outputs, in role order (a task has the first n), each with its cap.
LABEL_CAPS = (("entity", MAX_ENTITY_LABELS), ("head", MAX_PAIR_LABELS), ("tail", MAX_PAIR_LABELS))


@dataclass
class Example:
    """Token ids and label sets: ``entity`` per role (triples) or per entity type (entities);
    ``head``/``tail`` per predicate, empty for the entities task."""

    token_ids: list[int]
    entity: list[set[tuple[int, int]]]
    head: list[set[tuple[int, int]]] = field(default_factory=list)
    tail: list[set[tuple[int, int]]] = field(default_factory=list)


class TrainingError(Exception):
    """The training ran and produced nothing worth writing (its weights diverged)."""


def seed_everything(seed: int) -> None:
    import numpy as np
    import tensorflow as tf

    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)


# Why a labelled fact of a corpus is not trained on (``Counter`` keys of ``encode_record``'s and
# ``encode_entities``' ``left_out``; ``"labels"`` counts every fact looked at).
PAST_MAX_LENGTH = "past_max_length"
OFF_TOKEN_BOUNDARIES = "off_token_boundaries"


def _left_out_reason(enc: Any, start: int, end: int) -> str:
    """Why the characters ``[start, end)`` have no token span within the trained tokens."""
    whole = {o[0] for o in enc.offsets}, {o[1] for o in enc.offsets}
    return PAST_MAX_LENGTH if start in whole[0] and end in whole[1] else OFF_TOKEN_BOUNDARIES


def encode_record(
    record: dict[str, Any],
    tokenizer: Tokenizer,
    predicates: Sequence[str],
    max_length: int,
    left_out: Counter[str] | None = None,
) -> Example:
    """Token ids with ``[CLS]``/``[SEP]`` and GPLinker label sets (positions count ``[CLS]`` as 0).

    Each argument is labelled at its first occurrence; an argument that does not start and end on
    token boundaries, or lies past ``max_length``, drops its triple, counted in ``left_out`` by
    reason (``train`` logs the counts and writes them to ``training.json``).
    """
    text: str = record["text"]
    enc = tokenizer.encode(text)
    n = min(len(enc.token_ids), max_length - 2)
    starts = {enc.offsets[i][0]: i + 1 for i in range(n)}
    ends = {enc.offsets[i][1]: i + 1 for i in range(n)}
    index = {p: i for i, p in enumerate(predicates)}
    entity: list[set[tuple[int, int]]] = [set(), set()]
    head: list[set[tuple[int, int]]] = [set() for _ in predicates]
    tail: list[set[tuple[int, int]]] = [set() for _ in predicates]
    counts: Counter[str] = left_out if left_out is not None else Counter()

    def span(arg: str) -> tuple[int, int] | str:
        at = text.find(arg)
        if at < 0 or at not in starts or at + len(arg) not in ends:
            return _left_out_reason(enc, at, at + len(arg))
        return starts[at], ends[at + len(arg)]

    for s, p, o in record["triples"]:
        if p not in index:
            continue
        counts["labels"] += 1
        sub, obj = span(s), span(o)
        if isinstance(sub, str):
            counts[sub] += 1
            continue
        if isinstance(obj, str):
            counts[obj] += 1
            continue
        entity[0].add(sub)
        entity[1].add(obj)
        head[index[p]].add((sub[0], obj[0]))
        tail[index[p]].add((sub[1], obj[1]))
    ids = [tokenizer.cls_id, *enc.token_ids[:n], tokenizer.sep_id]
    return Example(ids, entity, head, tail)


def encode_entities(
    record: dict[str, Any],
    tokenizer: Tokenizer,
    entity_types: Sequence[str],
    max_length: int,
    left_out: Counter[str] | None = None,
) -> Example:
    """Token ids with ``[CLS]``/``[SEP]`` and one span set per entity type (typed GlobalPointer).

    The record's ``entities`` (``[[name, type], ...]``; without them, the arguments of its
    ``triples``) are labelled at every occurrence, except inside a longer one
    (``training.schema.entity_spans``). A span that does not start and end on token boundaries, or
    lies past ``max_length``, is left out and counted in ``left_out`` by reason; a type outside
    ``entity_types`` is skipped.
    """
    text: str = record["text"]
    enc = tokenizer.encode(text)
    n = min(len(enc.token_ids), max_length - 2)
    starts = {enc.offsets[i][0]: i + 1 for i in range(n)}
    ends = {enc.offsets[i][1]: i + 1 for i in range(n)}
    index = {t: i for i, t in enumerate(entity_types)}
    named = record.get("entities")
    if named is None:
        named = triple_entities([(str(s), str(p), str(o)) for s, p, o in record.get("triples", [])])
    labels: list[set[tuple[int, int]]] = [set() for _ in entity_types]
    counts: Counter[str] = left_out if left_out is not None else Counter()
    for start, end, type_ in entity_spans(text, [(str(a), str(b)) for a, b in named]):
        if type_ not in index:
            continue
        counts["labels"] += 1
        if start in starts and end in ends:
            labels[index[type_]].add((starts[start], ends[end]))
        else:
            counts[_left_out_reason(enc, start, end)] += 1
    ids = [tokenizer.cls_id, *enc.token_ids[:n], tokenizer.sep_id]
    return Example(ids, labels)


def _pad_labels(sets: list[set[tuple[int, int]]], size: int) -> list[list[tuple[int, int]]]:
    out = []
    for s in sets:
        items = sorted(s)[:size]
        out.append(items + [(0, 0)] * (size - len(items)))
    return out


def make_batch(
    examples: Sequence[Example], length: int, task: str = "triples"
) -> tuple[list[Any], list[Any]]:
    """Model inputs and fixed-shape label arrays: ``[entity, head, tail]`` (triples) or
    ``[entities]``, each ``(B, heads, K, 2)`` with ``(0, 0)`` padding."""
    import numpy as np

    tokens = np.zeros((len(examples), length), dtype="int32")
    for i, ex in enumerate(examples):
        tokens[i, : len(ex.token_ids)] = ex.token_ids
    segments = np.zeros_like(tokens)
    labels = [
        np.array([_pad_labels(getattr(ex, name), size) for ex in examples], dtype="int32")
        for name, size in LABEL_CAPS[: task_named(task).n_outputs]
    ]
    return [tokens, segments], labels


def plan_epoch(
    examples: Sequence[Example],
    batch_size: int,
    rng: random.Random,
    lengths: Sequence[int],
    full: bool = False,
) -> list[tuple[int, list[int]]]:
    """Shuffled batches of examples that share a padded length from ``lengths``. Each example is in
    one batch; with ``full``, a length's last batch is topped up to ``batch_size`` with examples of
    that length drawn again, so that every batch has one of ``len(lengths)`` shapes.

    >>> from types import SimpleNamespace as Ex
    >>> examples = [Ex(token_ids=[0] * n) for n in (3, 5, 9, 9, 9)]
    >>> sorted((length, len(b)) for length, b in plan_epoch(examples, 2, random.Random(0), [4, 16]))
    [(4, 1), (16, 2), (16, 2)]
    >>> batches = plan_epoch(examples, 2, random.Random(0), [4, 16], full=True)
    >>> sorted((length, len(b)) for length, b in batches)
    [(4, 2), (16, 2), (16, 2)]
    >>> sorted(i for _, b in batches for i in set(b))
    [0, 1, 2, 3, 4]
    """
    by_length: dict[int, list[int]] = {}
    for i, ex in enumerate(examples):
        length = next(x for x in lengths if x >= len(ex.token_ids))
        by_length.setdefault(length, []).append(i)
    batches = []
    for length, idx in sorted(by_length.items()):
        rng.shuffle(idx)
        if full:
            idx += [rng.choice(idx) for _ in range(-len(idx) % batch_size)]
        batches += [(length, idx[k : k + batch_size]) for k in range(0, len(idx), batch_size)]
    rng.shuffle(batches)
    return batches


def noise_tokens(tokens: Any, rate: float, pool: Any, rng: Any, keep: Sequence[int] = (0,)) -> Any:
    """A copy of ``tokens`` (``(B, L)`` ids) where each id not in ``keep`` (padding, ``[CLS]``,
    ``[SEP]``) is replaced, with probability ``rate``, by one drawn from ``pool`` (the corpus's token
    ids, so by their frequency). Positions do not move, so the labels stay true to their spans.

    >>> import numpy as np
    >>> t = np.array([[101, 5, 6, 7, 102, 0]])
    >>> noise_tokens(t, 1.0, np.array([9]), np.random.default_rng(0), keep=(0, 101, 102)).tolist()
    [[101, 9, 9, 9, 102, 0]]
    >>> bool((noise_tokens(t, 0.0, np.array([9]), np.random.default_rng(0)) == t).all())
    True
    """
    import numpy as np

    hit = (rng.random(tokens.shape) < rate) & ~np.isin(tokens, keep)
    out = tokens.copy()
    out[hit] = pool[rng.integers(0, len(pool), int(hit.sum()))]
    return out


def globalpointer_crossentropy(y_true: Any, y_pred: Any) -> Any:
    """Sparse multilabel categorical crossentropy for GlobalPointer (bert4keras GPLinker example)."""
    from bert4keras.backend import K, sparse_multilabel_categorical_crossentropy

    shape = K.shape(y_pred)
    y_true = K.cast(y_true, K.floatx())
    y_true = y_true[..., 0] * K.cast(shape[2], K.floatx()) + y_true[..., 1]
    y_pred = K.reshape(y_pred, (shape[0], -1, K.prod(shape[2:])))
    loss = sparse_multilabel_categorical_crossentropy(y_true, y_pred, True)
    return K.mean(K.sum(loss, axis=1))


def _warmup_linear_decay(peak: float, warmup: int, total: int) -> Any:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then linear decay to ``peak / 10``."""
    import tensorflow as tf
    from bert4keras.backend import keras

    class Schedule(keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[misc]
        def __call__(self, step: Any) -> Any:
            step = tf.cast(step, tf.float32)
            up = peak * step / max(warmup, 1)
            frac = tf.clip_by_value((step - warmup) / max(total - warmup, 1), 0.0, 1.0)
            down = peak * (1.0 - 0.9 * frac)
            return tf.where(step < warmup, up, down)

        def get_config(self) -> dict[str, Any]:
            return {"peak": peak, "warmup": warmup, "total": total}

    return Schedule()


class WeightAverage:
    """An exponential moving average of ``variables`` (``shadow = decay * shadow + (1 - decay) *
    weight`` after each ``update``), kept as TensorFlow variables so that an update costs one graph
    call, not a copy of the weights through numpy. Starts from the variables' current values; with
    decay 0.999 those weigh 0.999 ** steps after that many updates (0.0003 after 8,000).
    bert4keras's GPLinker example exports such an average instead of the last step's weights."""

    def __init__(self, variables: Sequence[Any], decay: float) -> None:
        import tensorflow as tf

        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be between 0 and 1, got {decay!r}")
        self.shadow = [tf.Variable(v.read_value(), trainable=False) for v in variables]
        pairs = list(zip(self.shadow, variables, strict=True))

        @tf.function  # type: ignore[untyped-decorator]
        def update() -> None:
            for average, weight in pairs:
                average.assign(decay * average + (1.0 - decay) * weight)

        self._update = update

    def update(self) -> None:
        self._update()

    def weights(self) -> list[Any]:
        """The averages as numpy arrays, in ``variables``' order."""
        return [v.numpy() for v in self.shadow]


def train(config: TrainConfig) -> Path:
    """Train, then export ``config.out_dir`` (SavedModel + ``model.json``). Returns the directory."""
    problems = config.problems()  # checked when it was made; again, in case a field was set since
    if problems:
        raise ValueError("; ".join(problems))
    task = task_named(config.task)
    # The export replaces out_dir: know now, not after the training, whether it may.
    reason = replaceable(config.out_dir, force=True, inputs=(config.train_path,))
    if reason is not None:
        raise FileExistsError(reason)
    seed_everything(config.seed)
    import numpy as np
    from bert4keras.backend import keras

    from training.export import export_model_dir
    from training.gplinker import build_gplinker, build_ner

    schema = schema_documents()
    labels = {Task.TRIPLES: [p["predicate"] for p in schema], Task.ENTITIES: list(ENTITY_TYPES)}[
        task
    ]
    tokenizer = Tokenizer.from_file(config.vocab_path)
    bert_config = {**config.bert_config, "vocab_size": tokenizer.vocab_size}
    if config.dropout is not None:
        bert_config["hidden_dropout_prob"] = config.dropout
        bert_config["attention_probs_dropout_prob"] = config.dropout
    bert_config["max_position_embeddings"] = max(
        bert_config.get("max_position_embeddings", 0), config.max_length
    )
    lengths = [x for x in (XLA_LENGTHS if config.xla else TRAIN_LENGTHS) if x < config.max_length]
    lengths.append(config.max_length)

    # Checked before any work: a line that is not a record, a predicate (an entity type) the
    # schema lacks, an argument not in its text: DataError naming the line.
    records = read_records(config.train_path, check=labels_check(config.task, labels))
    encode = {Task.TRIPLES: encode_record, Task.ENTITIES: encode_entities}[task]
    left_out: Counter[str] = Counter()
    examples = [encode(r, tokenizer, labels, config.max_length, left_out) for r in records]
    logger.info("%d %s training examples from %s", len(examples), config.task, config.train_path)
    if left_out[PAST_MAX_LENGTH] or left_out[OFF_TOKEN_BOUNDARIES]:
        logger.warning(
            "%d of the corpus's %d labelled %s are not trained on: %d lie past max_length %d "
            "tokens (a text's first %d are trained; the server windows longer texts), %d do not "
            "start and end on token boundaries",
            left_out[PAST_MAX_LENGTH] + left_out[OFF_TOKEN_BOUNDARIES],
            left_out["labels"],
            "triples" if task is Task.TRIPLES else "entity mentions",
            left_out[PAST_MAX_LENGTH],
            config.max_length,
            config.max_length - 2,
            left_out[OFF_TOKEN_BOUNDARIES],
        )
    trained = left_out["labels"] - left_out[PAST_MAX_LENGTH] - left_out[OFF_TOKEN_BOUNDARIES]
    if trained <= 0:  # a model of nothing: its heads would learn to answer nothing at all
        raise DataError(
            f"{config.train_path}: no labelled {'triple' if task is Task.TRIPLES else 'entity'} "
            f"can be trained on ({left_out['labels']} in the corpus, "
            f"{left_out['labels'] - trained} of them off token boundaries or past max_length)"
        )
    # make_batch keeps at most MAX_ENTITY_LABELS spans a role (or type) and MAX_PAIR_LABELS pairs a
    # predicate in one text: what is over is counted here, never dropped unseen.
    beyond_caps = sum(
        max(0, len(labelled) - cap)
        for ex in examples
        for name, cap in LABEL_CAPS[: task.n_outputs]
        for labelled in getattr(ex, name)
    )
    if beyond_caps:
        logger.warning(
            "%d labelled spans or pairs are over the per-text caps (%d spans a role or type, %d "
            "pairs a predicate) and are not trained on",
            beyond_caps,
            MAX_ENTITY_LABELS,
            MAX_PAIR_LABELS,
        )

    build_model = {Task.TRIPLES: build_gplinker, Task.ENTITIES: build_ner}[task]

    def build() -> Any:
        return build_model(bert_config, len(labels), head_size=config.head_size)

    model = build()
    rng = random.Random(config.seed)
    keep = (0, tokenizer.cls_id, tokenizer.sep_id)
    pool = np.array(
        [t for ex in examples for t in ex.token_ids if t not in keep] if config.token_noise else [],
        dtype="int32",
    )
    noise_rng = np.random.default_rng(config.seed)
    steps_per_epoch = len(
        plan_epoch(examples, config.batch_size, random.Random(0), lengths, config.xla)
    )
    planned = config.max_steps if config.max_steps else steps_per_epoch * config.epochs
    total = max(planned, config.warmup_steps + 1)
    optimizer = keras.optimizers.Adam(
        learning_rate=_warmup_linear_decay(config.learning_rate, config.warmup_steps, total)
    )
    model.compile(
        loss=[globalpointer_crossentropy] * task.n_outputs,
        optimizer=optimizer,
        jit_compile=config.xla,
    )
    # model.weights is get_weights()'s order, the order the export takes.
    average = WeightAverage(model.weights, config.ema) if config.ema else None

    started = time.monotonic()
    deadline = started + config.max_minutes * 60
    step = 0
    stopped = False
    epoch = 0
    while step < planned:
        running = 0.0
        for length, idx in plan_epoch(examples, config.batch_size, rng, lengths, config.xla):
            x, y = make_batch([examples[i] for i in idx], length, config.task)
            if config.token_noise:
                x[0] = noise_tokens(x[0], config.token_noise, pool, noise_rng, keep)
            loss = model.train_on_batch(x, y)
            if average is not None:
                average.update()
            running += float(loss[0] if isinstance(loss, list) else loss)
            step += 1
            if step % 50 == 0:
                logger.info(
                    "epoch %d step %d/%d loss %.3f (%.0fs)",
                    epoch + 1,
                    step,
                    total,
                    running / 50,
                    time.monotonic() - started,
                )
                running = 0.0
            if step >= planned:
                break
            if time.monotonic() > deadline:
                logger.warning("max_minutes reached after %d steps; stopping", step)
                stopped = True
                break
        if stopped:
            break
        epoch += 1
    minutes = (time.monotonic() - started) / 60
    logger.info("trained %d steps in %.1f min", step, minutes)
    weights = average.weights() if average is not None else model.get_weights()
    diverged = sum(1 for w in weights if not np.isfinite(w).all())
    if diverged:  # a NaN model loads and answers nothing: never written
        raise TrainingError(
            f"training diverged: {diverged} of the model's {len(weights)} weight arrays are not "
            f"finite after {step} steps; nothing was written (lower --lr, now "
            f"{config.learning_rate:g})"
        )

    doc = manifest_document(
        name=config.name or DEFAULT_NAMES[task],
        version=config.version,
        task=config.task,
        predicates=schema,  # the task's labels field is the one written
        entity_types=labels,
        vocab_path=VOCAB_NAME,
        vocab_sha256=sha256_file(config.vocab_path),
        max_length=config.serve_length or config.max_length,
        threshold=config.threshold,
        link_rule=config.link_rule,
    )
    # The export replaces the directory; a hand-written README.md there survives retraining.
    readme = config.out_dir / "README.md"
    readme_text = readme.read_bytes() if readme.is_file() else None
    out = export_model_dir(
        build,
        weights,
        config.out_dir,
        doc,
        mode="graph",
        force=True,
        vocab=config.vocab_path,
    )
    if readme_text is not None:
        (out / "README.md").write_bytes(readme_text)
    (out / "training.json").write_text(
        json.dumps(
            {
                "task": config.task,
                "train_path": str(config.train_path),
                "records": len(records),
                "labels": {
                    "total": left_out["labels"],
                    PAST_MAX_LENGTH: left_out[PAST_MAX_LENGTH],
                    OFF_TOKEN_BOUNDARIES: left_out[OFF_TOKEN_BOUNDARIES],
                    "beyond_caps": beyond_caps,
                },
                "epochs": config.epochs,
                "max_steps": config.max_steps,
                "steps": step,
                "steps_per_epoch": steps_per_epoch,
                "stopped_early": stopped,
                "minutes": round(minutes, 1),
                "batch_size": config.batch_size,
                "learning_rate": config.learning_rate,
                "warmup_steps": config.warmup_steps,
                "seed": config.seed,
                "token_noise": config.token_noise,
                "ema": config.ema,
                "xla": config.xla,
                "threshold": config.threshold,
                **({"link_rule": config.link_rule} if task is Task.TRIPLES else {}),
                "head_size": config.head_size,
                "max_length": config.max_length,
                "serve_length": config.serve_length or config.max_length,
                "bert_config": bert_config,
            },
            ensure_ascii=False,
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    return out
