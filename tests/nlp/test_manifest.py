import json
import shutil
from pathlib import Path

import pytest

from nlp.errors import ManifestError
from nlp.manifest import load_manifest, sha256_file, write_manifest
from tests import PROJECT_ROOT


@pytest.fixture
def model_copy(triples_model_dir, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(triples_model_dir, target)
    return target


def _edit(model_dir, change):
    path = model_dir / "model.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    change(doc)
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")


def test_manifest_loads_the_fixture(model_copy):
    m = load_manifest(model_copy)
    assert m.task == "triples" and m.labels == ("出生地", "妻子", "作者")
    assert m.length_buckets == (16, 32, 64) and m.max_length == 64
    assert m.summary()["predicates"][0] == {
        "predicate": "出生地",
        "subject_type": "人物",
        "object_type": "地点",
    }
    assert "vocab" not in m.summary()


BAD = [
    ("task", lambda d: d.update(task="ner")),
    ("task", lambda d: d.pop("task")),
    ("predicates", lambda d: d.update(predicates=[])),
    ("predicates[0].subject_type", lambda d: d["predicates"][0].pop("subject_type")),
    ("predicates", lambda d: d["predicates"].append(dict(d["predicates"][0]))),
    ("vocab.sha256", lambda d: d["vocab"].update(sha256="0" * 64)),
    ("vocab.path", lambda d: d["vocab"].update(path="no/such/vocab.txt")),
    ("max_length", lambda d: d.update(max_length="64")),
    ("max_length", lambda d: d.update(max_length=True)),
    # A billion planned a bucket shape per 16 tokens and ran out of memory before the load's check.
    ("max_length", lambda d: (d.update(max_length=10**9), d.pop("length_buckets"))),
    ("threshold", lambda d: d.update(threshold="high")),
    ("link_rule", lambda d: d.update(link_rule="max")),
    ("link_rule", lambda d: d.update(link_rule=None)),
    ("length_buckets", lambda d: d.update(length_buckets=[32, 16, 64])),
    ("length_buckets", lambda d: d.update(length_buckets=[16, 32])),
    ("batch_buckets", lambda d: d.update(batch_buckets=[0, 1])),
    ("single_row_length_step", lambda d: d.update(single_row_length_step=0)),
    ("single_row_length_step", lambda d: d.update(single_row_length_step=65)),
    ("single_row_length_step", lambda d: d.update(single_row_length_step=8.0)),
    ("single_row_length_step", lambda d: d.update(single_row_length_step=True)),
    ("outputs", lambda d: d.update(outputs=["a:0"])),
    ("inputs.segment_ids", lambda d: d.update(inputs={"token_ids": "x:0"})),
    ("format_version", lambda d: d.update(format_version=99)),
    ("do_lower_case", lambda d: d.update(do_lower_case="yes")),
    ("precision", lambda d: d.update(precision="bf16")),
    ("quantization", lambda d: d.update(precision="int8")),
    ("treshold", lambda d: d.update(treshold=0.5)),
    ("comment", lambda d: d.update(comment="trained on the 2026 corpus")),
]


@pytest.mark.parametrize(("field", "change"), BAD, ids=[f for f, _ in BAD])
def test_manifest_errors_name_the_field(model_copy, field, change):
    _edit(model_copy, change)
    with pytest.raises(ManifestError) as info:
        load_manifest(model_copy)
    assert info.value.field == field
    assert field in str(info.value)
    assert info.value.code == "invalid_manifest"


def test_manifest_an_unknown_field_is_refused_with_the_closest_declared_one(model_copy):
    """A misspelt field was ignored: the model ran on the default it was meant to change."""
    _edit(model_copy, lambda d: d.update(link_rul="mean"))
    with pytest.raises(
        ManifestError, match=r"'link_rul': unknown in format 1 \(did you mean 'link_rule'\?\)"
    ):
        load_manifest(model_copy)
    _edit(model_copy, lambda d: (d.pop("link_rul"), d.update(zzz=1)))
    with pytest.raises(
        ManifestError, match=r"'zzz': unknown in format 1 \(its fields: format_version, name"
    ):
        load_manifest(model_copy)


def test_manifest_link_rule_defaults_to_both_and_is_reported(model_copy):
    assert load_manifest(model_copy).link_rule == "both"
    _edit(model_copy, lambda d: d.update(link_rule="mean"))
    m = load_manifest(model_copy)
    assert m.link_rule == "mean" and m.summary()["link_rule"] == "mean"


def test_manifest_cardinality_is_read_per_predicate_and_written_only_when_limited(model_copy):
    assert {p.cardinality for p in load_manifest(model_copy).predicates} == {"many_to_many"}
    _edit(model_copy, lambda d: d["predicates"][0].update(cardinality="one_to_one"))
    m = load_manifest(model_copy)
    assert [p.cardinality for p in m.predicates][:2] == ["one_to_one", "many_to_many"]
    entries = m.summary()["predicates"]
    assert entries[0]["cardinality"] == "one_to_one" and "cardinality" not in entries[1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cardinality": "one"}, r"predicates\[0\]\.cardinality': expected one of many_to_many"),
        ({"cardinality": None}, r"predicates\[0\]\.cardinality': expected one of .* got None"),
        (
            {"cardinalty": "one_to_one"},
            r"'predicates\[0\]\.cardinalty': unknown in format 1 \(did you mean 'cardinality'\?\)",
        ),
    ],
)
def test_manifest_refuses_a_bad_or_misspelt_cardinality(model_copy, change, message):
    """A misspelt key would leave the predicate unlimited without a word."""
    _edit(model_copy, lambda d: d["predicates"][0].update(change))
    with pytest.raises(ManifestError, match=message):
        load_manifest(model_copy)


def test_manifest_single_row_length_step_defaults_to_8_and_null_turns_it_off(model_copy):
    assert load_manifest(model_copy).single_row_length_step == 8
    _edit(model_copy, lambda d: d.update(single_row_length_step=None))
    m = load_manifest(model_copy)
    assert m.single_row_length_step is None
    assert m.summary()["single_row_length_step"] is None


def test_manifest_missing_files_are_named(model_copy, tmp_path):
    (model_copy / "saved_model.pb").unlink()
    with pytest.raises(ManifestError, match=r"saved_model\.pb"):
        load_manifest(model_copy)
    with pytest.raises(ManifestError, match=r"model\.json"):
        load_manifest(tmp_path)
    with pytest.raises(ManifestError, match="not found"):
        load_manifest(tmp_path / "nowhere")


def test_manifest_invalid_json_is_reported(model_copy):
    (model_copy / "model.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(model_copy)


@pytest.mark.parametrize("text", ["[" * 100_000, '{"format_version": ' + "1" * 5000 + "}"])
def test_manifest_json_python_cannot_read_is_reported(model_copy, text):
    """Nesting past the parser's recursion limit and an integer over Python's digit limit are not
    JSONDecodeErrors: they escaped as tracebacks."""
    (model_copy / "model.json").write_text(text, encoding="utf-8")
    with pytest.raises(ManifestError, match="nested too deeply or a number too long"):
        load_manifest(model_copy)


def test_manifest_unreadable_model_json_is_a_manifest_error(model_copy, monkeypatch):
    real_read_text = Path.read_text

    def denied(self, *args, **kwargs):
        if self.name == "model.json":
            raise PermissionError(13, "Permission denied")
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)  # root ignores chmod
    with pytest.raises(ManifestError, match=r"model\.json: cannot read: Permission denied") as info:
        load_manifest(model_copy)
    assert info.value.field == "model.json"


def test_manifest_unreadable_vocab_is_a_manifest_error(model_copy, monkeypatch):
    vocab = load_manifest(model_copy).vocab_path
    real_open = Path.open

    def denied(self, *args, **kwargs):
        if self == vocab:
            raise PermissionError(13, "Permission denied")
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    with pytest.raises(ManifestError, match=f"cannot read {vocab}: Permission denied") as info:
        load_manifest(model_copy)
    assert info.value.field == "vocab.path"


def _own_vocab(model_dir, change):
    """Give ``model_dir`` a ``vocab.txt`` of its own, the fixture's changed by ``change`` (bytes to
    bytes), and the sha256 that passes the check."""
    from nlp.manifest import sha256_file

    vocab = model_dir / "vocab.txt"
    vocab.write_bytes(change(load_manifest(model_dir).vocab_path.read_bytes()))
    _edit(model_dir, lambda d: d.update(vocab={"path": "vocab.txt", "sha256": sha256_file(vocab)}))
    return vocab


BAD_VOCABS = [
    (
        "repeated-token",
        lambda b: b.replace("国\n".encode(), "国\n国\n".encode(), 1),
        "token '国' on lines",
    ),
    ("two-blank-lines", lambda b: b + b"\n\n", "a blank line on lines"),
    ("no-cls", lambda b: b.replace(b"[CLS]\n", b"[CLX]\n"), r"lacks \[CLS\]"),
    ("empty", lambda b: b"", "the vocab is empty"),
    ("not-utf8", lambda b: b + b"\xff\n", "not UTF-8 text"),
]


@pytest.mark.parametrize(
    ("change", "message"), [b[1:] for b in BAD_VOCABS], ids=[b[0] for b in BAD_VOCABS]
)
def test_manifest_refuses_a_bad_vocab_naming_the_file(model_copy, change, message):
    """A vocab with the right sha256 is still read: a repeated token would shift every id after
    it (bert4keras), and a vocab without the special tokens or not UTF-8 cannot be used."""
    vocab = _own_vocab(model_copy, change)
    with pytest.raises(ManifestError, match=message) as info:
        load_manifest(model_copy)
    assert info.value.field == "vocab.path"
    assert str(vocab) in info.value.message and "\n" not in info.value.message


def test_manifest_precision_decides_how_a_directory_may_run(model_copy):
    from nlp.errors import UnsupportedPrecision

    fp32 = load_manifest(model_copy)
    assert fp32.precision == "fp32" and fp32.quantization is None
    fp32.check_precision("fp32")
    fp32.check_precision("bf16")
    with pytest.raises(UnsupportedPrecision, match=r"needs an int8 model directory.*spo quantize"):
        fp32.check_precision("int8")
    made = {"tool": "neural-compressor-tf", "tool_version": "3.10"}
    _edit(model_copy, lambda d: d.update(precision="int8", quantization=made))
    int8 = load_manifest(model_copy)
    assert int8.precision == "int8" and int8.quantization == made
    int8.check_precision("int8")
    for other in ("fp32", "bf16"):
        with pytest.raises(
            UnsupportedPrecision, match=f"runs only with precision int8, not {other}"
        ):
            int8.check_precision(other)


# --- self-contained model directories (issue 19) ---------------------------------------------------


@pytest.mark.parametrize("name", ["demo", "ner"])
def test_manifest_demo_models_hold_their_vocab(name):
    from nlp.config import packaged_model_dir

    directory = packaged_model_dir(name)
    m = load_manifest(directory)
    assert m.vocab_path == (directory / "vocab.txt").resolve()
    assert json.loads((directory / "model.json").read_text(encoding="utf-8"))["vocab"]["path"] == (
        "vocab.txt"
    )


def _old_layout(model_copy, vocab_rel="vocab/vocab.txt"):
    """``model_copy`` as the old tools wrote it: model.json names a vocab outside the directory."""
    vocab = load_manifest(model_copy).vocab_path
    _edit(model_copy, lambda d: d["vocab"].update(path=vocab_rel))
    return vocab


@pytest.fixture
def old_project(tmp_path, triples_model_dir):
    """A project folder as the old tools left it: ``models/tiny/model.json`` names its vocab
    ``vocab/vocab.txt``, relative to the project root, where it is."""
    project = tmp_path / "project"
    model_dir = project / "models" / "tiny"
    shutil.copytree(triples_model_dir, model_dir)
    vocab = _old_layout(model_dir)
    (project / "vocab").mkdir()
    shutil.copyfile(vocab, project / "vocab" / "vocab.txt")
    return project


def test_manifest_old_layout_finds_the_vocab_in_a_folder_above(old_project, caplog):
    project, model_dir = old_project, old_project / "models" / "tiny"
    with caplog.at_level("WARNING", logger="nlp.manifest"):
        m = load_manifest(model_dir)
    assert m.vocab_path == (project / "vocab" / "vocab.txt").resolve()
    notes = [r.getMessage() for r in caplog.records if r.name == "nlp.manifest"]
    assert len(notes) == 1 and "\n" not in notes[0]
    assert f"spo copy-vocab {model_dir}" in notes[0]
    assert not (model_dir / "vocab.txt").exists()  # read-only: loading writes nothing


def test_manifest_old_layout_uses_the_packaged_vocab_when_its_sha256_matches(tmp_path, caplog):
    from nlp.config import DEMO_MODEL_DIR, DEMO_VOCAB

    model_dir = tmp_path / "demo"
    shutil.copytree(DEMO_MODEL_DIR, model_dir)
    (model_dir / "vocab.txt").unlink()
    _edit(model_dir, lambda d: d["vocab"].update(path="vocab/vocab.txt"))
    with caplog.at_level("WARNING", logger="nlp.manifest"):
        assert load_manifest(model_dir).vocab_path == DEMO_VOCAB.resolve()
    assert "spo copy-vocab" in caplog.text


def test_manifest_a_self_contained_directory_missing_its_vocab_says_so(tmp_path, caplog):
    """It read the package's identical vocab and called that "the old layout"."""
    from nlp.config import DEMO_MODEL_DIR, DEMO_VOCAB

    model_dir = tmp_path / "demo"
    shutil.copytree(DEMO_MODEL_DIR, model_dir)
    (model_dir / "vocab.txt").unlink()
    with caplog.at_level("WARNING", logger="nlp.manifest"):
        assert load_manifest(model_dir).vocab_path == DEMO_VOCAB.resolve()
    assert "vocab.txt missing from the directory" in caplog.text
    assert "old layout" not in caplog.text


def test_manifest_old_layout_without_its_vocab_names_the_field(model_copy):
    _old_layout(model_copy)  # the tiny vocab is not the packaged one, and no folder above has it
    with pytest.raises(ManifestError) as info:
        load_manifest(model_copy)
    assert info.value.field == "vocab.path"
    assert "vocab.txt beside model.json" in info.value.message


def test_manifest_copy_vocab_in_makes_an_old_directory_self_contained(old_project):
    from click.testing import CliRunner

    from app.cli import main

    project, model_dir = old_project, old_project / "models" / "tiny"
    result = CliRunner().invoke(main, ["copy-vocab", str(model_dir)])
    assert result.exit_code == 0, result.output
    assert "copied" in result.output
    shutil.rmtree(project / "vocab")
    m = load_manifest(model_dir)
    assert m.vocab_path == (model_dir / "vocab.txt").resolve()
    again = CliRunner().invoke(main, ["copy-vocab", str(model_dir)])
    assert again.exit_code == 0 and "nothing to do" in again.output


def test_manifest_copy_vocab_in_a_directory_it_cannot_write_is_one_line(old_project, monkeypatch):
    from click.testing import CliRunner

    from app.cli import main

    model_dir = old_project / "models" / "tiny"
    before = (model_dir / "model.json").read_bytes()

    def read_only(self, data):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(Path, "write_bytes", read_only)  # a read-only mount (root ignores chmod)
    result = CliRunner().invoke(main, ["copy-vocab", str(model_dir)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"cannot write into {model_dir}: Read-only file system" in result.output
    assert (model_dir / "model.json").read_bytes() == before


def test_manifest_vocab_in_a_subfolder_of_the_directory_is_no_old_layout(model_copy, caplog):
    vocab = load_manifest(model_copy).vocab_path
    (model_copy / "assets").mkdir()
    shutil.copyfile(vocab, model_copy / "assets" / "vocab.txt")
    _edit(model_copy, lambda d: d["vocab"].update(path="assets/vocab.txt"))
    with caplog.at_level("WARNING", logger="nlp.manifest"):
        assert load_manifest(model_copy).vocab_path == (model_copy / "assets/vocab.txt").resolve()
    assert not [r for r in caplog.records if r.name == "nlp.manifest"]


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_manifest_a_changed_graph_is_refused(model_copy):
    """One flipped bit in ``saved_model.pb`` (a constant of the graph) loaded and served garbage:
    the sha256 ``write_manifest`` records is checked at load."""
    doc = json.loads((model_copy / "model.json").read_text(encoding="utf-8"))
    write_manifest(model_copy, doc)
    graph = model_copy / "saved_model.pb"
    assert load_manifest(model_copy).saved_model_sha256 == sha256_file(graph)
    _flip_a_byte(graph)
    with pytest.raises(ManifestError, match=r"'saved_model\.sha256': mismatch") as caught:
        load_manifest(model_copy)
    assert caught.value.field == "saved_model.sha256"
    assert load_manifest(model_copy, check_files=False).saved_model_sha256 is not None


def test_manifest_without_the_graphs_sha256_loads_unchecked(model_copy):
    """A directory written before the field (or by hand) still loads."""
    _edit(model_copy, lambda doc: doc.pop("saved_model", None))
    _flip_a_byte(model_copy / "saved_model.pb")
    assert load_manifest(model_copy).saved_model_sha256 is None


def test_manifest_write_records_the_graph_only_where_there_is_one(model_copy, tmp_path):
    doc = json.loads((model_copy / "model.json").read_text(encoding="utf-8"))
    doc["saved_model"] = {"sha256": "0" * 64}  # carried over from a parent
    written = json.loads(write_manifest(model_copy, doc).read_text(encoding="utf-8"))
    assert written["saved_model"] == {"sha256": sha256_file(model_copy / "saved_model.pb")}
    elsewhere = tmp_path / "no-graph"
    elsewhere.mkdir()
    written = json.loads(write_manifest(elsewhere, doc).read_text(encoding="utf-8"))
    assert "saved_model" not in written


@pytest.mark.parametrize("name", ["demo", "ner"])
def test_manifest_committed_models_record_their_graph(name):
    directory = PROJECT_ROOT / "models" / name
    manifest = load_manifest(directory)
    assert manifest.saved_model_sha256 == sha256_file(directory / "saved_model.pb")


SYSTEM_REFUSES = [
    ("vocab", lambda d: d["vocab"].update(path="a" * 300)),  # a name over the file system's limit
    ("vocab", lambda d: d["vocab"].update(path="a\x00b")),
    ("vocab.path", lambda d: d["vocab"].update(path="vocab\ud800.txt")),
    ("name", lambda d: d.update(name="de\udc80mo")),
    ("predicates[0].predicate", lambda d: d["predicates"][0].update(predicate="\ud800日期")),
    ("threshold", lambda d: d.update(threshold=10**400)),
    ("batch_buckets", lambda d: d.update(batch_buckets=[1, 100_000])),
]


@pytest.mark.parametrize(("field", "change"), SYSTEM_REFUSES, ids=[f for f, _ in SYSTEM_REFUSES])
def test_manifest_refuses_what_the_system_cannot_use_naming_the_field(model_copy, field, change):
    """Each was an uncaught OSError, ValueError, OverflowError or UnicodeEncodeError (a reload that
    met one stopped the whole server), or, for a lone surrogate in a name or label, a model that
    loaded and then answered 500; the batch bucket would warm a (100000, 64) batch."""
    path = model_copy / "model.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    change(doc)
    path.write_text(json.dumps(doc), encoding="utf-8")  # ASCII escapes: "\ud800" as JSON has it
    with pytest.raises(ManifestError) as info:
        load_manifest(model_copy)
    assert info.value.field == field
    str(info.value).encode("utf-8")  # the message itself can be logged and answered


@pytest.mark.parametrize("name", ["saved_model.pb", "variables/variables.index", "model.json"])
def test_manifest_refuses_a_fifo_in_place_of_a_file(model_copy, name):
    """TensorFlow (and the sizing's read of model.json) opened it and waited for a writer forever."""
    import os

    from app.core.sizing import model_precision

    path = model_copy / name
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ManifestError, match="not a regular file"):
        load_manifest(model_copy)
    assert model_precision(model_copy) == "fp32"  # returns at once: loading says what is wrong


def test_manifest_copy_vocab_replaces_a_link_instead_of_writing_through_it(old_project, tmp_path):
    """A vocab.txt linking elsewhere was written through: the file it named was overwritten (and
    the directory never became self-contained)."""
    from click.testing import CliRunner

    from app.cli import main

    model_dir = old_project / "models" / "tiny"
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's file\n", encoding="utf-8")
    (model_dir / "vocab.txt").symlink_to(victim)
    result = CliRunner().invoke(main, ["copy-vocab", str(model_dir)])
    assert result.exit_code == 0, result.output
    assert victim.read_text(encoding="utf-8") == "someone's file\n"
    assert not (model_dir / "vocab.txt").is_symlink()
    assert load_manifest(model_dir).vocab_path == (model_dir / "vocab.txt").resolve()


def test_manifest_a_write_that_fails_leaves_the_old_model_json_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``spo copy-vocab`` on a full disk left model.json cut at the point of failure (it was written
    in place) and said "model.json is unchanged"; the next load failed: not valid JSON."""
    import errno
    import os

    from nlp.manifest import write_manifest

    path = tmp_path / "model.json"
    path.write_text('{"old": true}\n', encoding="utf-8")

    def full(src: str, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space left"):
        write_manifest(tmp_path, {"new": True})
    assert path.read_text(encoding="utf-8") == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["model.json"]
    monkeypatch.undo()
    write_manifest(tmp_path, {"new": True})
    assert json.loads(path.read_text(encoding="utf-8")) == {"new": True}


def test_manifest_a_field_given_twice_is_refused(model_copy):
    """``"threshold": 0.5, "threshold": 0.0`` was taken silently, the last one winning."""
    path = model_copy / "model.json"
    text = path.read_text(encoding="utf-8")
    path.write_text(
        text.replace('"threshold":', '"threshold": 0.5, "threshold":', 1), encoding="utf-8"
    )
    with pytest.raises(ManifestError, match="the field 'threshold' is given twice") as info:
        load_manifest(model_copy)
    assert info.value.field == "threshold"
