import doctest
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import nlp  # noqa: F401
import training.train
from nlp.config import DEMO_VOCAB
from nlp.tokenization import Tokenizer
from training.corpus import CorpusGenerator
from training.schema import CARDINALITY, ENTITY_TYPES, PREDICATES, schema_documents
from training.train import encode_entities, encode_record, make_batch, noise_tokens


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(DEMO_VOCAB)


def test_train_labels_align_to_server_token_offsets(tokenizer: Tokenizer) -> None:
    rec = {
        "text": "Tom·李，1985年生于湖南长沙，毕业于北京大学。",
        "triples": [["Tom·李", "出生地", "湖南长沙"], ["Tom·李", "毕业院校", "北京大学"]],
    }
    ex = encode_record(rec, tokenizer, PREDICATES, 64)
    enc = tokenizer.encode(rec["text"])
    assert ex.token_ids == [tokenizer.cls_id, *enc.token_ids, tokenizer.sep_id]

    def text_of(span: tuple[int, int]) -> str:
        return rec["text"][enc.offsets[span[0] - 1][0] : enc.offsets[span[1] - 1][1]]

    assert {text_of(s) for s in ex.entity[0]} == {"Tom·李"}
    assert {text_of(s) for s in ex.entity[1]} == {"湖南长沙", "北京大学"}
    p = PREDICATES.index("出生地")
    ((sh, oh),) = ex.head[p]
    ((st, ot),) = ex.tail[p]
    assert text_of((sh, st)) == "Tom·李" and text_of((oh, ot)) == "湖南长沙"


def test_train_doctests() -> None:
    assert doctest.testmod(training.train).failed == 0


def test_train_token_noise_replaces_about_its_share_and_never_the_markers() -> None:
    keep = (0, 101, 102)
    tokens = np.zeros((64, 100), dtype="int32")
    tokens[:, 0], tokens[:, 1:81], tokens[:, 81] = 101, 7, 102  # then padding
    pool = np.array([5, 6], dtype="int32")
    noised = noise_tokens(tokens, 0.25, pool, np.random.default_rng(3), keep)
    assert noised.shape == tokens.shape and noised is not tokens
    changed = noised != tokens
    assert not changed[:, [0, *range(81, 100)]].any()  # [CLS], [SEP], padding untouched
    assert set(np.unique(noised[changed])) <= {5, 6}
    assert 0.2 < changed[:, 1:81].mean() < 0.3
    assert (tokens[:, 1:81] == 7).all()  # the input array is not modified
    again = noise_tokens(tokens, 0.25, pool, np.random.default_rng(3), keep)
    assert (again == noised).all()  # reproducible from the seed


@pytest.mark.parametrize("rate", [-0.1, 0.6, float("nan")])
def test_train_refuses_a_token_noise_outside_its_range(tmp_path: Path, rate: float) -> None:
    from training.train import TrainConfig, train

    with pytest.raises(ValueError, match="token_noise"):
        train(TrainConfig(train_path=tmp_path / "none.jsonl", out_dir=tmp_path, token_noise=rate))


@pytest.mark.parametrize("decay", [-0.1, 1.0, float("nan")])
def test_train_refuses_an_ema_outside_its_range(tmp_path: Path, decay: float) -> None:
    from training.train import TrainConfig, train

    with pytest.raises(ValueError, match="ema"):
        train(TrainConfig(train_path=tmp_path / "none.jsonl", out_dir=tmp_path, ema=decay))


def test_train_weight_average_moves_by_its_decay_and_keeps_the_variables_order() -> None:
    import tensorflow as tf

    from training.train import WeightAverage

    a, b = tf.Variable([0.0, 4.0]), tf.Variable(8.0)
    average = WeightAverage([a, b], 0.75)
    a.assign([4.0, 4.0])
    b.assign(0.0)
    average.update()
    first, second = average.weights()
    assert first.tolist() == [1.0, 4.0] and second == 6.0  # 0.75 * old + 0.25 * new
    average.update()
    assert average.weights()[0].tolist() == [1.75, 4.0]
    assert a.numpy().tolist() == [4.0, 4.0]  # the model's own weights are not touched
    with pytest.raises(ValueError, match="decay"):
        WeightAverage([a], 1.0)


def test_train_truncation_drops_triples_past_max_length_and_counts_them(
    tokenizer: Tokenizer,
) -> None:
    rec = {"text": "一" * 40 + "张三出生于北京。", "triples": [["张三", "出生地", "北京"]]}
    left_out: Counter[str] = Counter()
    ex = encode_record(rec, tokenizer, PREDICATES, 32, left_out)
    assert len(ex.token_ids) == 32
    assert not ex.entity[0] and not any(ex.head)
    assert left_out == {"labels": 1, "past_max_length": 1}
    # An argument inside a word piece (``ab`` of the token ``abc``) can never be labelled.
    rec = {
        "text": "张三出生于北京。app",
        "triples": [["张三", "出生地", "北京"], ["张三", "出生地", "ap"]],
    }
    encode_record(rec, tokenizer, PREDICATES, 32, left_out)
    assert left_out == {"labels": 3, "past_max_length": 1, "off_token_boundaries": 1}
    entities = {"text": "一" * 40 + "张三出生于北京。", "entities": [["张三", "人物"]]}
    counted: Counter[str] = Counter()
    encode_entities(entities, tokenizer, ENTITY_TYPES, 32, counted)
    assert counted == {"labels": 1, "past_max_length": 1}


def test_train_batches_have_fixed_label_shapes(tokenizer: Tokenizer) -> None:
    recs = list(CorpusGenerator(seed=4).records(8))
    exs = [encode_record(r.__dict__, tokenizer, PREDICATES, 128) for r in recs]
    (tokens, segments), (entity, head, tail) = make_batch(exs, 128)
    assert tokens.shape == segments.shape == (8, 128)
    assert entity.shape[:2] == (8, 2) and entity.shape[-1] == 2
    assert head.shape[:2] == tail.shape[:2] == (8, len(PREDICATES))


def test_train_entity_labels_align_to_server_token_offsets(tokenizer: Tokenizer) -> None:
    rec = {
        "text": "Tom·李生于湖南长沙，毕业于北京大学。Tom·李",
        "triples": [],
        "entities": [["Tom·李", "人物"], ["湖南长沙", "地点"], ["北京大学", "机构"]],
    }
    ex = encode_entities(rec, tokenizer, ENTITY_TYPES, 64)
    enc = tokenizer.encode(rec["text"])
    assert ex.token_ids == [tokenizer.cls_id, *enc.token_ids, tokenizer.sep_id]
    assert not ex.head and not ex.tail

    def texts(type_: str) -> list[str]:
        spans = ex.entity[ENTITY_TYPES.index(type_)]
        return sorted(rec["text"][enc.offsets[h - 1][0] : enc.offsets[t - 1][1]] for h, t in spans)

    assert texts("人物") == ["Tom·李", "Tom·李"]  # every occurrence
    assert texts("地点") == ["湖南长沙"] and texts("机构") == ["北京大学"]
    assert texts("作品") == []


def test_train_entity_labels_fall_back_to_triple_arguments(tokenizer: Tokenizer) -> None:
    rec = {"text": "张三出生于北京。", "triples": [["张三", "出生地", "北京"]]}
    ex = encode_entities(rec, tokenizer, ENTITY_TYPES, 32)
    assert [len(s) for s in ex.entity] == [1, 1, 0, 0, 0, 0]
    cut = encode_entities({**rec, "text": "一" * 40 + rec["text"]}, tokenizer, ENTITY_TYPES, 32)
    assert len(cut.token_ids) == 32 and not any(cut.entity)


def test_train_entity_batches_have_one_fixed_label_array(tokenizer: Tokenizer) -> None:
    recs = list(CorpusGenerator(seed=4).records(8))
    exs = [encode_entities(r.__dict__, tokenizer, ENTITY_TYPES, 128) for r in recs]
    (tokens, _), labels = make_batch(exs, 128, "entities")
    assert tokens.shape == (8, 128)
    (entities,) = labels
    assert entities.shape[:2] == (8, len(ENTITY_TYPES)) and entities.shape[-1] == 2
    assert entities.any()


@pytest.mark.slow
def test_train_the_demo_model_declares_the_schemas_predicates() -> None:
    """models/demo/model.json is the schema training writes: the same predicates, types and
    cardinalities (a decoding limit added to the schema reaches the committed model too)."""
    from nlp.config import DEMO_MODEL_DIR

    doc = json.loads((DEMO_MODEL_DIR / "model.json").read_text(encoding="utf-8"))
    assert doc["predicates"] == schema_documents()


def test_train_tiny_run_writes_a_loadable_model_dir(tmp_path: Path) -> None:
    from nlp.manifest import load_manifest
    from training.corpus import write_corpus
    from training.evaluate import evaluate, read_records
    from training.gplinker import TINY_BERT_CONFIG
    from training.train import TrainConfig, train

    data = tmp_path / "train.jsonl"
    write_corpus(data, 40, seed=3)
    out = train(
        TrainConfig(
            train_path=data,
            out_dir=tmp_path / "model",
            epochs=1,
            batch_size=8,
            max_length=64,
            head_size=16,
            # Six steps leave the model near random: at threshold 0 it would score every span
            # pair, which decodes slowly. A huge threshold still runs the whole serving path,
            # predicting nothing.
            threshold=1e9,
            link_rule="mean",
            bert_config=dict(TINY_BERT_CONFIG),
        )
    )
    manifest = load_manifest(out)
    assert manifest.task == "triples" and len(manifest.predicates) == len(PREDICATES)
    assert manifest.vocab_path == (out / "vocab.txt").resolve()  # self-contained (issue 19)
    assert manifest.threshold == 1e9 and manifest.link_rule == "mean"
    limited = {
        p.predicate: p.cardinality for p in manifest.predicates if p.cardinality != "many_to_many"
    }
    assert limited == CARDINALITY and set(limited.values()) == {"one_to_one", "many_to_one"}
    trained = json.loads((out / "training.json").read_text())
    assert trained["steps"] >= 1 and trained["threshold"] == 1e9 and trained["link_rule"] == "mean"
    scores, errors = evaluate(out, data)
    assert scores.records == 40 and scores.predicted == 0 and scores.gold > 0
    assert len(errors) == sum(1 for r in read_records(data) if r["triples"])


@pytest.mark.slow
def test_train_max_steps_is_an_exact_stop_across_epochs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import training.export
    from training.corpus import write_corpus
    from training.gplinker import TINY_BERT_CONFIG
    from training.train import TrainConfig, WeightAverage, train

    averaged: list[list[np.ndarray]] = []
    exported: list[list[np.ndarray]] = []
    average_of, export = WeightAverage.weights, training.export.export_model_dir

    def spy_average(self: WeightAverage) -> list[np.ndarray]:
        averaged.append(average_of(self))
        return averaged[-1]

    def spy_export(build, weights, *args, **kwargs):  # type: ignore[no-untyped-def]
        exported.append(weights)
        return export(build, weights, *args, **kwargs)

    monkeypatch.setattr(WeightAverage, "weights", spy_average)
    monkeypatch.setattr(training.export, "export_model_dir", spy_export)

    data = tmp_path / "train.jsonl"
    write_corpus(data, 24, seed=5)
    (tmp_path / "model").mkdir()  # an earlier model directory, its README written by hand
    (tmp_path / "model" / "model.json").write_text("{}", encoding="utf-8")
    (tmp_path / "model" / "README.md").write_text("notes", encoding="utf-8")
    out = train(
        TrainConfig(
            train_path=data,
            out_dir=tmp_path / "model",
            epochs=1,
            max_steps=7,
            warmup_steps=2,
            dropout=0.0,
            token_noise=0.2,
            ema=0.9,
            batch_size=8,
            max_length=64,
            head_size=16,
            bert_config=dict(TINY_BERT_CONFIG),
        )
    )
    record = json.loads((out / "training.json").read_text())
    assert record["steps"] == 7 and record["max_steps"] == 7 and not record["stopped_early"]
    assert record["steps_per_epoch"] < 7  # the run went past one epoch
    assert record["bert_config"]["hidden_dropout_prob"] == 0.0
    assert record["token_noise"] == 0.2 and record["ema"] == 0.9
    assert (
        len(averaged) == len(exported) == 1 and exported[0] is averaged[0]
    )  # the average is exported
    assert (out / "README.md").read_text(encoding="utf-8") == "notes"  # kept across retraining


@pytest.mark.slow
def test_train_xla_run_gives_every_step_a_full_batch_of_a_few_lengths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``xla`` each batch shape is compiled once: every batch is full and its length one of
    XLA_LENGTHS (up to max_length), and the run still writes a model that loads and answers."""
    from training.corpus import write_corpus
    from training.evaluate import evaluate
    from training.train import XLA_LENGTHS, train

    shapes: list[tuple[int, ...]] = []
    batch_of = training.train.make_batch

    def spy(examples, length, task="triples"):  # type: ignore[no-untyped-def]
        x, y = batch_of(examples, length, task)
        shapes.append(x[0].shape)
        return x, y

    monkeypatch.setattr(training.train, "make_batch", spy)
    data = tmp_path / "train.jsonl"
    write_corpus(data, 30, seed=7)  # 30 texts, batches of 4: some lengths' last batch is short
    out = train(_tiny(tmp_path, data, xla=True, max_steps=9, max_length=80))  # type: ignore[arg-type]
    assert len(shapes) == 9 and {b for b, _ in shapes} == {4}
    assert {length for _, length in shapes} <= {x for x in XLA_LENGTHS if x < 80} | {80}
    record = json.loads((out / "training.json").read_text())
    assert record["xla"] is True and record["steps"] == 9
    scores, _ = evaluate(out, data)
    assert scores.records == 30 and scores.predicted == 0


@pytest.mark.slow
def test_train_tiny_entities_run_writes_a_loadable_ner_model_dir(tmp_path: Path) -> None:
    from nlp.manifest import load_manifest
    from training.corpus import write_corpus
    from training.evaluate import evaluate, gold_entities, read_records
    from training.gplinker import TINY_BERT_CONFIG
    from training.train import TrainConfig, train

    data = tmp_path / "train.jsonl"
    write_corpus(data, 24, seed=3)
    out = train(
        TrainConfig(
            train_path=data,
            out_dir=tmp_path / "ner",
            task="entities",
            max_steps=3,
            warmup_steps=1,
            batch_size=8,
            max_length=64,
            serve_length=48,  # served in windows of 48 tokens, trained on 64
            head_size=16,
            bert_config=dict(TINY_BERT_CONFIG),
        )
    )
    manifest = load_manifest(out)
    assert manifest.max_length == 48 and manifest.length_buckets[-1] == 48
    record = json.loads((out / "training.json").read_text())
    assert (record["max_length"], record["serve_length"]) == (64, 48)
    assert manifest.task == "entities" and manifest.name == "ner"
    assert manifest.entity_types == ENTITY_TYPES and manifest.n_outputs == 1
    assert json.loads((out / "training.json").read_text())["task"] == "entities"
    doc = json.loads((out / "model.json").read_text(encoding="utf-8"))
    doc["threshold"] = 1e9  # near-random weights: predict nothing, but run the whole serving path
    (out / "model.json").write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    scores, errors = evaluate(out, data)
    gold = sum(len(gold_entities(r)) for r in read_records(data))
    assert scores.records == 24 and scores.predicted == 0 and scores.gold == gold > 0
    assert all(e["spurious"] == [] and e["missed"] for e in errors)


def _tiny(tmp_path: Path, data: Path, **changes: object) -> object:
    from training.gplinker import TINY_BERT_CONFIG
    from training.train import TrainConfig

    fields: dict[str, object] = {
        "train_path": data, "out_dir": tmp_path / "model", "max_steps": 2, "batch_size": 4,
        "max_length": 64, "head_size": 16, "threshold": 1e9, "bert_config": dict(TINY_BERT_CONFIG),
    }  # fmt: skip
    return TrainConfig(**{**fields, **changes})  # type: ignore[arg-type]


def test_train_refuses_a_corpus_with_nothing_to_train_on(tmp_path: Path) -> None:
    """Every record without a triple (or every argument off token boundaries) trained a model of
    nothing and wrote it, exit 0."""
    from training.evaluate import DataError
    from training.train import train

    data = tmp_path / "empty.jsonl"
    data.write_text('{"text": "今天天气很好。", "triples": []}\n' * 5, encoding="utf-8")
    with pytest.raises(DataError, match="no labelled triple can be trained on"):
        train(_tiny(tmp_path, data))  # type: ignore[arg-type]
    assert not (tmp_path / "model").exists()


def test_train_refuses_to_replace_a_directory_holding_its_corpus(tmp_path: Path) -> None:
    """--out replaced the directory the corpus was in: the corpus was deleted with it."""
    from training.corpus import write_corpus
    from training.train import train

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.json").write_text("{}")
    data = model / "corpus.jsonl"
    write_corpus(data, 10, seed=3)
    with pytest.raises(FileExistsError, match=r"is inside .* which would be replaced"):
        train(_tiny(tmp_path, data))  # type: ignore[arg-type]
    assert data.is_file()


@pytest.mark.slow
def test_train_a_diverged_run_writes_nothing(tmp_path: Path) -> None:
    """A learning rate of 1e30 left NaN weights: the model was written, loaded and answered
    nothing."""
    from training.corpus import write_corpus
    from training.train import TrainingError, train

    data = tmp_path / "train.jsonl"
    write_corpus(data, 20, seed=3)
    with pytest.raises(TrainingError, match=r"training diverged: .* \(lower --lr"):
        train(_tiny(tmp_path, data, learning_rate=1e30, max_steps=3, warmup_steps=0))  # type: ignore[arg-type]
    assert not (tmp_path / "model").exists()
