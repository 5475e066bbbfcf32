"""``training.conversion``: the checks ``spo quantize``, ``spo export-onnx`` and ``spo export-openvino``
share, and that each command makes them (before it needs its optional extra, so these run anywhere)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main as cli
from nlp.manifest import sha256_file
from training.conversion import check_conversion

COMMANDS = ("quantize", "export-onnx", "export-openvino")


class Refused(Exception):
    pass


def _edit_manifest(directory: Path, **changes: object) -> None:
    doc = json.loads((directory / "model.json").read_text(encoding="utf-8"))
    doc.update(changes)
    (directory / "model.json").write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")


@pytest.fixture
def sources(triples_model_dir: Path, tmp_path: Path) -> dict[str, Path]:
    """An fp32 SavedModel directory and every kind of source a converter must refuse."""
    (tmp_path / "file").write_text("x", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    onnx_like = tmp_path / "onnx"
    shutil.copytree(triples_model_dir, onnx_like)
    shutil.rmtree(onnx_like / "variables")
    (onnx_like / "saved_model.pb").unlink()
    (onnx_like / "model.onnx").write_bytes(b"x")
    engine = {"name": "onnx", "file": "model.onnx", "opset": 17, "precision": "fp32",
              "sha256": sha256_file(onnx_like / "model.onnx"), "tools": {}}  # fmt: skip
    _edit_manifest(onnx_like, engine=engine)
    int8_like = tmp_path / "int8"
    shutil.copytree(triples_model_dir, int8_like)
    quantization = {"tool": "neural-compressor-tf", "tool_version": "3.10"}
    _edit_manifest(int8_like, precision="int8", quantization=quantization)
    return {
        "fp32": triples_model_dir,
        "missing": tmp_path / "missing",
        "file": tmp_path / "file",
        "empty": tmp_path / "empty",
        "onnx": onnx_like,
        "int8": int8_like,
    }


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("missing", "model directory not found: "),
        ("file", "is a file, not a model directory"),
        ("empty", r"is not a usable model directory: .*model\.json"),
        (
            "onnx",
            r"already an onnx model directory \(no SavedModel in it\); quantize the SavedModel",
        ),
        (
            "int8",
            r"already quantized \(int8 by neural-compressor-tf 3\.10\); quantize its fp32 parent",
        ),
    ],
)
def test_conversion_refuses_every_source_but_an_fp32_savedmodel(
    sources: dict[str, Path], tmp_path: Path, source: str, message: str
) -> None:
    with pytest.raises(Refused, match=message):
        check_conversion(
            sources[source], tmp_path / "out", force=True, action="quantize", error=Refused
        )


def test_conversion_output_is_free_or_forced_never_the_source(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    fp32 = sources["fp32"]
    manifest = check_conversion(fp32, tmp_path / "out", force=False, action="x", error=Refused)
    assert manifest.engine == "tf" and manifest.precision == "fp32"
    (tmp_path / "out").mkdir()
    with pytest.raises(Refused, match=r"out exists \(use --force to replace it\)"):
        check_conversion(fp32, tmp_path / "out", force=False, action="x", error=Refused)
    assert check_conversion(fp32, tmp_path / "out", force=True, action="x", error=Refused)
    with pytest.raises(Refused, match="exists and is not a directory"):
        check_conversion(fp32, sources["file"], force=True, action="x", error=Refused)
    # Spelled another way, and forced: still the source, still refused.
    for same in (fp32, fp32 / ".." / fp32.name):
        with pytest.raises(Refused, match="is the model directory itself"):
            check_conversion(fp32, same, force=True, action="x", error=Refused)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_converter_refuses_a_converted_source_in_one_line(
    sources: dict[str, Path], tmp_path: Path, command: str
) -> None:
    for source, message in (
        ("onnx", "already an onnx model directory"),
        ("int8", "already quantized (int8 by neural-compressor-tf 3.10)"),
    ):
        result = CliRunner().invoke(cli, [command, str(sources[source]), str(tmp_path / "out")])
        assert result.exit_code == 1, result.output
        assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_no_converter_writes_over_its_own_source_even_forced(
    sources: dict[str, Path], command: str
) -> None:
    fp32 = sources["fp32"]
    before = {p.relative_to(fp32): sha256_file(p) for p in fp32.rglob("*") if p.is_file()}
    result = CliRunner().invoke(cli, [command, str(fp32), str(fp32), "--force"])
    assert result.exit_code == 1, result.output
    assert "is the model directory itself" in result.output
    after = {p.relative_to(fp32): sha256_file(p) for p in fp32.rglob("*") if p.is_file()}
    assert after == before


def test_replaceable_is_free_or_a_model_directory_or_empty_never_other_files(
    triples_model_dir: Path, tmp_path: Path
) -> None:
    """One rule for every writer of a model directory: with --force a model directory or an empty
    one may be replaced, a folder of other files never (it would be deleted)."""
    from training.conversion import replaceable

    model = tmp_path / "model"
    shutil.copytree(triples_model_dir, model)
    (tmp_path / "empty").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine", encoding="utf-8")
    assert replaceable(tmp_path / "free", force=False) is None
    assert (
        replaceable(model, force=True) is None
        and replaceable(tmp_path / "empty", force=True) is None
    )
    assert "exists (use --force" in str(replaceable(model, force=False))
    assert "not a model directory (no model.json in it) and not empty" in str(
        replaceable(work, force=True)
    )
    assert "exists and is not a directory" in str(replaceable(work / "notes.txt", force=True))


def test_replaceable_asks_whether_the_place_can_be_written_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked before training or converting (was: a traceback when the model was staged, after an
    hour's training); the question leaves nothing behind."""
    import tempfile

    from training.config import TrainConfig
    from training.conversion import replaceable
    from training.train import train

    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    under_a_file = tmp_path / "notes.txt" / "models" / "demo"
    assert str(replaceable(under_a_file, force=True)).endswith(
        "notes.txt is a file, not a directory"
    )
    with pytest.raises(FileExistsError, match=r"notes\.txt is a file, not a directory"):
        train(TrainConfig(train_path=tmp_path / "missing.jsonl", out_dir=under_a_file))
    assert replaceable(tmp_path / "new" / "model", force=False) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]

    def read_only(**kwargs: object) -> str:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    assert replaceable(tmp_path / "model", force=False) == (
        f"cannot write {tmp_path / 'model'}: Read-only file system"
    )


def test_no_writer_deletes_a_folder_of_other_files(triples_model_dir: Path, tmp_path: Path) -> None:
    """spo train (which always replaces --out), spo export --force and the converters with --force
    refuse an output folder that holds other files, before any work, and leave it as it was."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine", encoding="utf-8")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "张三出生于北京。", "triples": []}\n', encoding="utf-8")
    schema = tmp_path / "types.json"
    schema.write_text('["人物"]', encoding="utf-8")
    runs = [
        ["train", str(corpus), "--out", str(work), "--max-steps", "1"],
        ["export", "--bert-config", str(corpus), "--weights", "w", "--schema", str(schema),
         "--out", str(work), "--force"],
        *([command, str(triples_model_dir), str(work), "--force"] for command in COMMANDS),
    ]  # fmt: skip
    for args in runs:
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1, (args, result.output)
        assert "not a model directory (no model.json in it) and not empty" in result.output
        assert "Traceback" not in result.output
        assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]


def test_a_replaced_model_is_deleted_only_once_the_new_one_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model ``--force`` replaces was deleted before the new one was moved in: an error (or a
    kill) in between lost both. Now it is moved aside, and put back when the move fails."""
    from training.export import staged_model_dir

    out = tmp_path / "model"
    out.mkdir()
    (out / "model.json").write_text('{"version": "old"}', encoding="utf-8")
    with staged_model_dir(out, force=True) as target:
        target.mkdir()
        (target / "model.json").write_text('{"version": "new"}', encoding="utf-8")
    assert json.loads((out / "model.json").read_text(encoding="utf-8"))["version"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing staged is left

    real_rename = Path.rename

    def failing(self: Path, target: Path) -> Path:
        if self.name == "model" and self.parent != tmp_path:  # the new model moving in
            raise OSError(28, "No space left on device")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", failing)
    with pytest.raises(OSError, match="No space"), staged_model_dir(out, force=True) as target:
        target.mkdir()
        (target / "model.json").write_text('{"version": "newer"}', encoding="utf-8")
    assert json.loads((out / "model.json").read_text(encoding="utf-8"))["version"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_directory_made_at_out_during_the_work_is_never_replaced_without_force(
    tmp_path: Path,
) -> None:
    """``staged_model_dir`` checks ``out`` again before the move: a folder another run made there
    while this one worked was moved aside and deleted, even without ``--force``."""
    from training.export import staged_model_dir

    out = tmp_path / "model"
    for force in (False, True):
        with pytest.raises(FileExistsError), staged_model_dir(out, force=force) as target:
            target.mkdir()
            (target / "model.json").write_text("{}", encoding="utf-8")
            out.mkdir(exist_ok=True)
            (out / "precious.txt").write_text("mine", encoding="utf-8")
        assert (out / "precious.txt").read_text(encoding="utf-8") == "mine"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing staged is left


def test_conversion_never_replaces_a_link_the_current_directory_or_its_inputs_home(
    tmp_path, monkeypatch
):
    """Each ended an hour's training in a traceback (a dangling link: NotADirectoryError; the
    current directory or a mount point: EBUSY), or deleted the corpus inside OUT."""
    from training.conversion import replaceable

    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    assert "is a symbolic link" in replaceable(link, force=True)
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.json").write_text("{}")
    monkeypatch.chdir(model)
    assert "the current directory" in replaceable(model, force=True)
    monkeypatch.chdir(tmp_path)
    assert replaceable(model, force=True) is None
    assert "which would be replaced" in replaceable(
        model, force=True, inputs=[model / "corpus.jsonl"]
    )
