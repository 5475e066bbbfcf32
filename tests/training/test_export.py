import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TINY_PREDICATES, _vocab_tokens
from training.export import read_schema


def _write_schema(path: Path, fmt: str, first: dict[str, str] | None = None) -> Path:
    """TINY_PREDICATES as a schema file, with ``first``'s keys added to the first predicate."""
    entries = [{**p, **(first or {})} if i == 0 else p for i, p in enumerate(TINY_PREDICATES)]
    if fmt == "duie-jsonl":
        path.write_text(
            "\n".join(json.dumps(p, ensure_ascii=False) for p in entries) + "\n", encoding="utf-8"
        )
    else:
        path.write_text(json.dumps(entries, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("fmt", ["duie-jsonl", "json-list"])
def test_export_read_schema_accepts_duie_lines_and_json_list(tmp_path: Path, fmt: str) -> None:
    task, items = read_schema(_write_schema(tmp_path / "schema", fmt))
    assert task == "triples"
    assert items == TINY_PREDICATES


def test_export_read_schema_entity_types_and_duie2_objects(tmp_path: Path) -> None:
    (tmp_path / "ner.json").write_text('["人物", "地点", "人物"]', encoding="utf-8")
    assert read_schema(tmp_path / "ner.json") == ("entities", ["人物", "地点"])
    line = {"object_type": {"@value": "地点"}, "predicate": "出生地", "subject_type": "人物"}
    (tmp_path / "duie2.json").write_text(json.dumps(line, ensure_ascii=False), encoding="utf-8")
    assert read_schema(tmp_path / "duie2.json")[1][0]["object_type"] == "地点"
    (tmp_path / "bad.json").write_text('[{"subject_type": "人物"}]', encoding="utf-8")
    with pytest.raises(ValueError, match="predicate"):
        read_schema(tmp_path / "bad.json")
    # A JSON null was exported as the name "None".
    for field, value in (
        ("predicate", None),
        ("subject_type", None),
        ("object_type", {"@value": None}),
        ("predicate", 7),
    ):
        entry = {**line, field: value}
        (tmp_path / "null.json").write_text(json.dumps(entry), encoding="utf-8")
        shown = value["@value"] if isinstance(value, dict) else value
        with pytest.raises(ValueError, match=f"entry 0: {field} is not a string: {shown!r}"):
            read_schema(tmp_path / "null.json")


def test_export_read_schema_carries_a_predicates_cardinality(tmp_path: Path) -> None:
    line = {"object_type": "城市", "predicate": "首都", "subject_type": "国家"}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({**line, "cardinality": "one_to_one"}), encoding="utf-8")
    assert read_schema(path)[1] == [{**line, "cardinality": "one_to_one"}]
    path.write_text(json.dumps({**line, "cardinality": "1:1"}), encoding="utf-8")
    with pytest.raises(
        ValueError, match=r"entry 0: cardinality must be one of many_to_many, .*'1:1'"
    ):
        read_schema(path)


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a": 1}\n' + "[" * 100_000, "1" * 5000])
def test_export_read_schema_names_json_python_cannot_read(tmp_path: Path, text: str) -> None:
    (tmp_path / "deep.json").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=r"deep\.json: nested too deeply or a number too long"):
        read_schema(tmp_path / "deep.json")


def test_export_schema_or_vocab_not_utf8_is_named_with_its_line(
    tmp_path: Path, vocab_path: Path
) -> None:
    """Both ended in Python's bare "'utf-8' codec can't decode byte 0xff", naming no file."""
    from training.export import export_user_model
    from training.gplinker import TINY_BERT_CONFIG

    schema = tmp_path / "schema.json"
    schema.write_bytes(b'["\xe4\xba\xba",\n"\xff"]')
    with pytest.raises(ValueError, match=re.escape(f"{schema}: not UTF-8 text (line 2: invalid")):
        read_schema(schema)
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(vocab_path.read_bytes() + b"\xff\n")
    lines = vocab.read_bytes().count(b"\n")
    (tmp_path / "bert_config.json").write_text(json.dumps(TINY_BERT_CONFIG), encoding="utf-8")
    with pytest.raises(
        ValueError, match=re.escape(f"{vocab}: the vocab is not UTF-8 text (line {lines}")
    ):
        export_user_model(
            bert_config_path=tmp_path / "bert_config.json", weights_path=tmp_path / "w.h5",
            schema_path=_write_schema(tmp_path / "schema", "json-list"),
            out_dir=tmp_path / "out", vocab_path=vocab,
        )  # fmt: skip
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("fmt", "compiled"), [("duie-jsonl", False), ("json-list", False), ("json-list", True)]
)
def test_export_user_model_scores_match_keras(
    tmp_path: Path, vocab_path: Path, fmt: str, compiled: bool
) -> None:
    """``compiled``: the weights of a model trained with ``compile`` + ``fit`` (its .weights.h5 file
    also holds the optimizer's and the metrics' state: it was refused, 156 arrays for 49)."""
    import tensorflow as tf

    import nlp  # noqa: F401
    from nlp.manifest import load_manifest
    from nlp.runtime import SessionRuntime
    from training.export import export_user_model
    from training.gplinker import TINY_BERT_CONFIG, build_gplinker

    config = {**TINY_BERT_CONFIG, "vocab_size": len(_vocab_tokens())}
    tf.random.set_seed(3)
    model = build_gplinker(config, len(TINY_PREDICATES), head_size=16)
    weights = tmp_path / "best_model.weights.h5"
    if compiled:
        from training.train import globalpointer_crossentropy

        model.compile(loss=[globalpointer_crossentropy] * 3, optimizer="adam", metrics=["mae"])
        x = np.array([[2, 40, 41, 3]], dtype=np.int32)
        y = [
            np.zeros((1, n, 4, 4), dtype=np.float32)
            for n in (2, len(TINY_PREDICATES), len(TINY_PREDICATES))
        ]
        model.train_on_batch([x, np.zeros_like(x)], y)
    model.save_weights(str(weights))
    ids = np.array([[2, 40, 41, 42, 43, 3] + [0] * 10, [2, 50, 51, 3] + [0] * 12], dtype=np.int32)
    # Before exporting: building in a TF1 graph invalidates Keras models made outside it.
    expected = model.predict([ids, np.zeros_like(ids)], verbose=0)
    (tmp_path / "bert_config.json").write_text(json.dumps(config), encoding="utf-8")

    out = export_user_model(
        bert_config_path=tmp_path / "bert_config.json",
        weights_path=weights,
        schema_path=_write_schema(tmp_path / "schema", fmt, {"cardinality": "one_to_one"}),
        out_dir=tmp_path / "exported",
        vocab_path=vocab_path,
        head_size=16,
        max_length=16,
    )
    manifest = load_manifest(out)
    assert manifest.input_names == ("Input-Token:0", "Input-Segment:0")
    assert manifest.vocab_path == (out / "vocab.txt").resolve()  # self-contained (issue 19)
    assert (out / "vocab.txt").read_bytes() == vocab_path.read_bytes()
    assert [p.predicate for p in manifest.predicates] == [p["predicate"] for p in TINY_PREDICATES]
    assert [p.cardinality for p in manifest.predicates][:2] == ["one_to_one", "many_to_many"]
    runtime = SessionRuntime(
        out,
        shapes=[(2, 16)],
        input_names=manifest.input_names,
        output_names=manifest.output_names,
        n_outputs=3,
        vocab_size=len(_vocab_tokens()),
    )
    served = runtime.run(ids, np.zeros_like(ids))
    runtime.close()
    for got, want in zip(served, expected, strict=True):
        assert got.shape == want.shape
        finite = np.isfinite(want)
        np.testing.assert_array_equal(np.isfinite(got), finite)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{", "not JSON (Expecting property name"),
        ("[" * 100_000, "not a bert config (nested too deeply or a number too long)"),
        ("[1]", "a bert config is a JSON object"),
        ({"hidden_size": None}, "'hidden_size' must be a positive integer, got None"),
        ({"num_hidden_layers": 0}, "'num_hidden_layers' must be a positive integer, got 0"),
        ({"intermediate_size": True}, "'intermediate_size' must be a positive integer, got True"),
        ({"num_attention_heads": 3}, "hidden_size 32 is not a multiple of num_attention_heads 3"),
        ({"hidden_act": ""}, "'hidden_act' must name an activation"),
        ({"vocab_size": 5}, "vocab_size 5 is smaller than the vocab's"),
        ({"type_vocab_size": 0}, "'type_vocab_size' must be a positive integer, got 0"),
        ({"max_position_embeddings": "abc"}, "'max_position_embeddings' must be a positive"),
    ],
)
def test_export_user_model_refuses_a_bert_config_it_cannot_build(
    tmp_path: Path, vocab_path: Path, config: str | dict[str, object], message: str
) -> None:
    """Before, an incomplete config ended in bert4keras's TypeError; now the file is named."""
    from training.export import export_user_model
    from training.gplinker import TINY_BERT_CONFIG

    path = tmp_path / "bert_config.json"
    text = config if isinstance(config, str) else json.dumps({**TINY_BERT_CONFIG, **config})
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}: {message}")):
        export_user_model(
            bert_config_path=path, weights_path=tmp_path / "w.h5",
            schema_path=_write_schema(tmp_path / "schema", "json-list"),
            out_dir=tmp_path / "out", vocab_path=vocab_path,
        )  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_export_user_model_refuses_missing_or_mismatched_weights(
    tmp_path: Path, vocab_path: Path
) -> None:
    """Weights that are not there, or saved from a model of another shape (here: one predicate
    more than the schema names), are refused naming what has to match, never a Keras traceback."""
    import nlp  # noqa: F401
    from training.export import export_user_model
    from training.gplinker import TINY_BERT_CONFIG, build_gplinker

    config = {**TINY_BERT_CONFIG, "vocab_size": len(_vocab_tokens())}
    (tmp_path / "bert_config.json").write_text(json.dumps(config), encoding="utf-8")
    schema = _write_schema(tmp_path / "schema", "json-list")
    weights = tmp_path / "other.weights.h5"
    build_gplinker(config, len(TINY_PREDICATES) + 1, head_size=16).save_weights(str(weights))
    common = {"bert_config_path": tmp_path / "bert_config.json", "schema_path": schema,
              "out_dir": tmp_path / "out", "vocab_path": vocab_path, "head_size": 16}  # fmt: skip
    with pytest.raises(ValueError, match="no such weights file"):
        export_user_model(weights_path=tmp_path / "missing.h5", **common)
    with pytest.raises(
        ValueError,
        match=rf"cannot load these weights into a triples model of {len(TINY_PREDICATES)}",
    ):
        export_user_model(weights_path=weights, **common)
    assert not (tmp_path / "out").exists()


def test_export_user_model_refuses_what_would_not_load_and_never_replaces_its_inputs(
    tmp_path: Path, vocab_path: Path
) -> None:
    """Each exported with exit 0 a model the loader refused (positions, a schema entry without
    types, a TF checkpoint of another architecture: random heads); --force with the weights inside
    --out deleted them."""
    import nlp  # noqa: F401
    from training.export import export_user_model
    from training.gplinker import TINY_BERT_CONFIG, build_gplinker, build_ner

    config = {**TINY_BERT_CONFIG, "vocab_size": len(_vocab_tokens())}
    (tmp_path / "bert_config.json").write_text(json.dumps(config), encoding="utf-8")
    schema = _write_schema(tmp_path / "schema", "json-list")
    weights = tmp_path / "w.weights.h5"
    build_gplinker(config, len(TINY_PREDICATES), head_size=16).save_weights(str(weights))
    common = {"bert_config_path": tmp_path / "bert_config.json", "vocab_path": vocab_path,
              "out_dir": tmp_path / "out", "head_size": 16, "max_length": 16}  # fmt: skip
    positions = config.get("max_position_embeddings", 512)
    with pytest.raises(ValueError, match=f"--max-length {positions + 1} is more than the"):
        export_user_model(weights_path=weights, schema_path=schema,
                          **{**common, "max_length": positions + 1})  # fmt: skip
    untyped = tmp_path / "untyped.json"
    untyped.write_text(json.dumps([{"predicate": p["predicate"]} for p in TINY_PREDICATES]))
    with pytest.raises(ValueError, match=r"the model would not load: model\.json: field"):
        export_user_model(weights_path=weights, schema_path=untyped, **common)
    ner_checkpoint = tmp_path / "ner" / "w"
    build_ner(config, 2, head_size=16).save_weights(str(ner_checkpoint))  # a TF checkpoint
    with pytest.raises(ValueError, match="not bound to checkpointed values"):
        export_user_model(weights_path=ner_checkpoint, schema_path=schema, **common)
    assert not (tmp_path / "out").exists()
    checkpoint = tmp_path / "triples" / "w"
    build_gplinker(config, len(TINY_PREDICATES), head_size=16).save_weights(str(checkpoint))
    export_user_model(weights_path=checkpoint, schema_path=schema, **common)  # every variable
    inside = tmp_path / "out" / "w.weights.h5"
    inside.write_bytes(weights.read_bytes())
    with pytest.raises(ValueError, match=r"is inside .* which would be replaced"):
        export_user_model(weights_path=inside, schema_path=schema, force=True, **common)
    assert inside.is_file()


@pytest.mark.parametrize("saved_as", ["w.weights.h5", "ck/w"])
def test_export_user_model_refuses_weights_the_model_has_no_place_for(
    tmp_path: Path, vocab_path: Path, saved_as: str
) -> None:
    """A deeper encoder's weights with a shallower config, or a triples model's with an entity-type
    schema, loaded what matched and dropped the rest: an export of a model that was never trained,
    exit 0 (a legacy .h5 file was refused; a .weights.h5 file or a checkpoint was not)."""
    import nlp  # noqa: F401
    from training.export import export_user_model
    from training.gplinker import TINY_BERT_CONFIG, build_gplinker

    config = {**TINY_BERT_CONFIG, "vocab_size": len(_vocab_tokens())}
    shallow = {**config, "num_hidden_layers": config["num_hidden_layers"] - 1}
    (tmp_path / "bert_config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "shallow.json").write_text(json.dumps(shallow), encoding="utf-8")
    schema = _write_schema(tmp_path / "schema", "json-list")
    types = tmp_path / "types.json"
    types.write_text('["人物", "地点"]', encoding="utf-8")
    weights = tmp_path / saved_as
    build_gplinker(config, len(TINY_PREDICATES), head_size=16).save_weights(str(weights))
    common = {"weights_path": weights, "vocab_path": vocab_path, "out_dir": tmp_path / "out",
              "head_size": 16, "max_length": 16}  # fmt: skip
    for bert_config, schema_path in (("shallow.json", schema), ("bert_config.json", types)):
        with pytest.raises(ValueError, match="cannot load these weights into a") as refused:
            export_user_model(
                bert_config_path=tmp_path / bert_config, schema_path=schema_path, **common
            )
        if saved_as.endswith(".h5"):  # a checkpoint may fail on a shape first
            assert "the file holds 49 weight arrays and the model built has" in str(refused.value)
    assert not (tmp_path / "out").exists()
    export_user_model(bert_config_path=tmp_path / "bert_config.json", schema_path=schema, **common)
    assert (tmp_path / "out" / "model.json").is_file()


def test_export_user_model_an_encoder_that_cannot_be_built_is_one_line(
    tmp_path: Path, vocab_path: Path
) -> None:
    """A vocab_size of 2**34 (a typo) ended in TensorFlow's ResourceExhaustedError traceback."""
    import nlp  # noqa: F401
    from training.export import export_user_model
    from training.gplinker import TINY_BERT_CONFIG

    config = {**TINY_BERT_CONFIG, "vocab_size": 2**34}
    (tmp_path / "bert_config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "w.weights.h5").write_bytes(b"")
    with pytest.raises(ValueError, match=r"bert_config\.json: cannot build its encoder: "):
        export_user_model(
            bert_config_path=tmp_path / "bert_config.json",
            weights_path=tmp_path / "w.weights.h5",
            schema_path=_write_schema(tmp_path / "schema", "json-list"),
            out_dir=tmp_path / "out",
            vocab_path=vocab_path,
            head_size=16,
            max_length=16,
        )
    assert not (tmp_path / "out").exists()


def test_export_an_interrupt_between_the_renames_keeps_the_model_it_replaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (or SIGTERM) after the old directory was moved aside and before the new one took its
    place: only an OSError put the old one back, and the clean-up then deleted both."""
    from training.export import staged_model_dir

    out = tmp_path / "model"
    out.mkdir()
    (out / "model.json").write_text("old", encoding="utf-8")
    rename = Path.rename

    def interrupted(self: Path, target: Path) -> Path:
        if self.name == "model" and Path(target) == out:
            raise KeyboardInterrupt
        return rename(self, target)

    with pytest.raises(KeyboardInterrupt), staged_model_dir(out, force=True) as staging:
        staging.mkdir()
        (staging / "model.json").write_text("new", encoding="utf-8")
        monkeypatch.setattr(Path, "rename", interrupted)
    monkeypatch.undo()
    assert (out / "model.json").read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
