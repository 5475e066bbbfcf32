"""``spo spark-extract`` and ``app.spark.job`` on PySpark ``local[2]`` with the demo model: every row equals
``spo extract``'s for the same input, record for record, good and bad records alike.

PySpark and a JRE are what ``make test`` installs (the ``spark`` extra, ``.ci/run``); outside CI a
machine without them skips this module, in CI it fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from app.batch import BatchOptions, run_batch
from app.cli import main
from app.core.settings import DEFAULT_MODEL_DIR

if not os.environ.get("CI"):
    pytest.importorskip(
        "pyspark", reason="the spark extra is not installed (make test installs it)"
    )
    if shutil.which("java") is None:
        pytest.skip("no Java runtime (make test / .ci/run install one)", allow_module_level=True)

from app.spark import job as spo_spark

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MAX_CHARS = 120
SENTENCES = [
    "李白出生于碎叶城。",
    "鲁迅原名周树人，1881年9月25日出生于浙江绍兴。",
    "《霸王别姬》是陈凯歌执导的电影，张国荣、巩俐主演。",
    "马云创办了阿里巴巴，公司总部位于杭州。",
    "周杰伦演唱了《七里香》，方文山作词。",
    "（张三）出生于北京！？；：“王五”",
    "😀张三😀出生于😀北京",
    "Cafe\u0301 张三 e\u0301\u0301 北京",
    "  \u3000张 三\t北京  ",
]


def corpus_lines(n: int = 300, seed: int = 7) -> list[bytes]:
    """JSON lines: mostly sentences, with every kind of bad record spread through them."""
    rng = random.Random(seed)
    lines: list[bytes] = []
    for i in range(n):
        text = "".join(rng.choices(SENTENCES, k=rng.randint(1, 3)))
        record: dict[str, Any] = {"id": f"r{i}" if i % 3 else i, "text": text}
        if i % 10 == 4:
            del record["id"]  # the line number becomes the id
        lines.append(json.dumps(record, ensure_ascii=False).encode())
    bad = [
        b"{oops",  # invalid JSON
        b"",  # empty line
        b'{"id": "empty", "text": ""}',
        b'{"id": "long", "text": "' + ("张" * (MAX_CHARS + 1)).encode() + b'"}',
        b'{"id": "huge", "text": "' + ("x" * (13 * MAX_CHARS + (1 << 20))).encode() + b'"}',
        b"[1, 2]",
        b'{"id": "no-text"}',
        b'{"id": "null", "text": null}',
        b'{"id": "number", "text": 12}',
        b'{"id": "surrogate", "text": "\\ud83d\\u5317\\u4eac"}',
        b'{"id": "nan", "text": NaN}',
        b"\xff\xfe not utf-8",
        b'{"id": "crlf", "text": "\xe5\x8c\x97\xe4\xba\xac"}\r',
        b'{"id": {"nested": [1, 2]}, "text": "\xe5\x8c\x97\xe4\xba\xac"}',
    ]
    for j, line in enumerate(bad):
        lines.insert(1 + j * (len(lines) // len(bad)), line)
    lines[0] = b"\xef\xbb\xbf" + lines[0]  # a BOM on the first line
    return lines


def spo_extract_lines(path: Path, tmp: Path) -> list[bytes]:
    out = tmp / "spo-extract.jsonl"
    options = BatchOptions(
        inputs=(str(path),),
        output=str(out),
        model_dir=DEFAULT_MODEL_DIR,
        workers=0,
        max_text_chars=MAX_CHARS,
    )
    run_batch(options)
    return out.read_bytes().splitlines()


def part_lines(directory: Path) -> list[bytes]:
    """The output's lines, part files in order (Spark writes one per partition)."""
    return [
        line for part in sorted(directory.glob("part-*")) for line in part.read_bytes().splitlines()
    ]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spo_spark.session("local[2]", {"spark.ui.enabled": "false"})
    yield session
    session.stop()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    tmp = tmp_path_factory.mktemp("spark")
    path = tmp / "corpus.jsonl"
    path.write_bytes(b"\n".join(corpus_lines()) + b"\n")
    return path, spo_extract_lines(path, tmp)


def test_spark_extract_cli_jsonl_equals_spo_extract(
    spark: Any, corpus: tuple[Path, list[bytes]], tmp_path: Path
) -> None:
    path, expected = corpus
    out = tmp_path / "out"
    args = ["spark-extract", str(path), str(out), "--master", "local[2]", "--partitions", "3"]
    args += ["--max-text-chars", str(MAX_CHARS)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"{len(expected)} records" in result.output
    errors = sum(b'"error":{"code"' in line for line in expected)
    assert f"{errors} errors" in result.output
    assert len(list(out.glob("part-*"))) == 3
    got = part_lines(out)
    assert len(got) == len(expected) > 300
    for g, e in zip(got, expected, strict=True):
        assert g == e  # byte-identical, record for record, in input order
    codes = {json.loads(e)["error"]["code"] for e in expected if b'"error":{"code"' in e}
    assert codes == {"invalid_json", "invalid_input", "text_too_long"}

    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1
    assert "exists; use --force" in again.output
    assert part_lines(out) == got  # nothing touched


def test_spark_extract_parquet_text_input_and_shipped_model(spark: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    lines = [s.encode() for s in SENTENCES]
    lines += [b"", ("张" * (MAX_CHARS + 1)).encode(), b"\xffbad"]
    path = tmp_path / "texts.txt"
    path.write_bytes(b"\r\n".join(lines))  # CRLF, and no newline after the last line
    expected = [json.loads(line) for line in spo_extract_lines(path, tmp_path)]
    options = spo_spark.SparkExtractOptions(
        inputs=(str(path),),
        output=str(tmp_path / "out.parquet"),
        output_format="parquet",
        max_text_chars=MAX_CHARS,
        ship_model=True,
    )
    summary = spo_spark.run_spark_extract(spark, options)
    assert (summary.records, summary.errors) == (len(expected), 2)
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == ["id", "entities", "triples", "error"]
    rows = table.to_pylist()
    assert len(rows) == len(expected)
    for row, exp in zip(rows, expected, strict=True):
        assert row["id"] == str(exp["id"])
        if "error" in exp:
            assert row["error"] == exp["error"]
            assert row["entities"] is None and row["triples"] is None
        else:
            assert row["error"] is None
            assert row["entities"] == exp["entities"]
            assert row["triples"] == exp["triples"]
    assert any(row["triples"] for row in rows)  # the demo model finds something


def test_spark_extract_dataframe_passes_ids_through(spark: Any) -> None:
    df = spark.createDataFrame(
        [(10, SENTENCES[0]), (11, None), (12, "张" * (MAX_CHARS + 1)), (13, SENTENCES[2])],
        "doc long, body string",
    )
    out = spo_spark.extract_dataframe(
        df, DEFAULT_MODEL_DIR, id_col="doc", text_col="body", max_text_chars=MAX_CHARS
    )
    assert out.columns == ["id", "entities", "triples", "error"]
    rows = {r["id"]: r.asDict(recursive=True) for r in out.collect()}
    assert sorted(rows) == [10, 11, 12, 13]
    assert rows[11]["error"]["code"] == "invalid_input"
    assert rows[12]["error"]["code"] == "text_too_long"
    assert rows[10]["error"] is None
    assert {t["predicate"] for t in rows[10]["triples"]} == {"出生地"}


def test_spark_extract_refuses_bad_inputs_clearly(spark: Any, tmp_path: Path) -> None:
    missing = CliRunner().invoke(
        main, ["spark-extract", str(tmp_path / "nope.txt"), str(tmp_path / "o")]
    )
    assert missing.exit_code == 1
    assert "cannot read the input" in missing.output
    (tmp_path / "x.csv").write_text("a\n")
    fmt = CliRunner().invoke(main, ["spark-extract", str(tmp_path / "x.csv"), str(tmp_path / "o")])
    assert fmt.exit_code == 1 and "--input-format txt or jsonl" in fmt.output
    conf = CliRunner().invoke(main, ["spark-extract", "a", "b", "--conf", "novalue"])
    assert conf.exit_code == 2 and "KEY=VALUE" in conf.output
    with pytest.raises(spo_spark.SparkExtractError, match="no column"):
        spo_spark.extract_dataframe(spark.createDataFrame([(1,)], "id long"), DEFAULT_MODEL_DIR)
    env = CliRunner().invoke(
        main, ["spark-extract", "a", "b", "--master", "local[1]", "--python-env", "env.tar.gz"]
    )
    assert env.exit_code == 2 and "--python-env is for a cluster master" in env.output
    both = CliRunner().invoke(
        main, ["spark-extract", "a", "b", "--python", "/x/python", "--python-env", "e.tar.gz"]
    )
    assert both.exit_code == 2 and "exclude each other" in both.output


def test_spark_extract_never_overwrites_an_input_or_other_files(spark: Any, tmp_path: Path) -> None:
    """Spark's overwrite deletes the whole output path first: --force must not reach an input, a
    folder of other files or a file; it replaces an earlier output (or an empty folder)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("张艺谋执导了《红高粱》。\n", encoding="utf-8")
    (tmp_path / "notes.md").write_text("keep\n")

    def problem(output: Path | str, inputs: tuple[str, ...] = (str(data / "in.txt"),)) -> Any:
        return spo_spark.output_problem(spark, str(output), inputs, force=True)

    assert "is (or holds) the input" in problem(data / "in.txt")
    assert "is (or holds) the input" in problem(data)
    assert "is (or holds) the input" in problem(f"{data}/", (f"file://{data}/*.txt",))
    assert "not a spark-extract output (data, notes.md)" in problem(tmp_path, ("elsewhere.txt",))
    assert "notes.md is a file, not a spark-extract output" in problem(
        tmp_path / "notes.md", ("x",)
    )
    assert problem(tmp_path / "dataset") is None  # a sibling whose name starts the same
    (tmp_path / "empty").mkdir()
    assert problem(tmp_path / "empty") is None
    assert "use --force" in spo_spark.output_problem(
        spark, str(tmp_path / "empty"), ("x.txt",), force=False
    )
    args = ["spark-extract", str(data / "in.txt"), str(tmp_path), "--force", "--master", "local[1]"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 1 and "choose another OUTPUT" in refused.output
    assert (data / "in.txt").is_file() and (tmp_path / "notes.md").read_text() == "keep\n"
    earlier = tmp_path / "out"
    first = CliRunner().invoke(main, [*args[:2], str(earlier), *args[3:]])
    assert first.exit_code == 0, first.output
    assert problem(earlier) is None  # _SUCCESS, part-*, their .crc files: an earlier output


def test_spark_extract_reads_a_tree_of_files_in_order_by_their_names(
    spark: Any, tmp_path: Path
) -> None:
    """Several files came out biggest first (Spark packs splits into tasks by size) unless
    --partitions was given; a name with a space crashed the job (Spark lists it as %20); a file
    in a subfolder was skipped without a word."""
    tree = tmp_path / "in dir"
    (tree / "sub").mkdir(parents=True)
    sizes = {"a b.txt": 3, "b.txt": 40, "sub/c.txt": 10}
    for name, n in sizes.items():
        lines = [SENTENCES[i % len(SENTENCES)] + f"（{name}第{i}行）" for i in range(n)]
        (tree / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    files = [str(tree / name) for name in sorted(sizes)]  # "a b.txt" < "b.txt" < "sub/c.txt"
    expected_out = tmp_path / "expected.jsonl"
    run_batch(BatchOptions(inputs=tuple(files), output=str(expected_out),
                           model_dir=DEFAULT_MODEL_DIR, workers=0, max_text_chars=MAX_CHARS))  # fmt: skip
    expected = expected_out.read_bytes().splitlines()
    options = spo_spark.SparkExtractOptions(
        inputs=(str(tree),), output=str(tmp_path / "out"), max_text_chars=MAX_CHARS
    )
    summary = spo_spark.run_spark_extract(spark, options)
    assert summary.records == sum(sizes.values()) == len(expected)
    got = part_lines(tmp_path / "out")
    assert [json.loads(g)["id"] for g in got][:4] == [
        f"{tree}/a b.txt:1", f"{tree}/a b.txt:2", f"{tree}/a b.txt:3", f"{tree}/b.txt:1",
    ]  # fmt: skip
    assert got == expected  # spo extract's lines, byte for byte, in the files' order


def test_spark_extract_never_reads_its_own_output_and_a_cut_gzip_is_one_line(
    spark: Any, tmp_path: Path
) -> None:
    """A glob could match OUTPUT (checked against the glob's fixed head only): --force then
    deleted the input it was reading and failed. An output inside an input directory would be read
    back by the next run. A cut gzip ended in a py4j traceback."""
    import gzip

    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("张艺谋执导了《红高粱》。\n", encoding="utf-8")
    (data / "out").mkdir()  # an earlier run's output, matched by the glob below

    def problem(output: Path, inputs: tuple[str, ...]) -> Any:
        return spo_spark.output_problem(spark, str(output), inputs, force=True)

    assert "is (or holds) the input" in problem(data / "out", (f"{data}/*",))
    assert "is inside the input" in problem(data / "out", (str(data),))
    assert problem(tmp_path / "elsewhere", (f"{data}/*",)) is None
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(gzip.compress(("张艺谋执导了《红高粱》。\n" * 500).encode())[:60])
    with pytest.raises(spo_spark.SparkExtractError, match=r"^the Spark job failed: .*cut\.txt\.gz"):
        spo_spark.read_records(spark, (str(cut),))


def test_spark_extract_a_precision_the_model_cannot_run_is_refused_before_the_job(
    spark: Any, tmp_path: Path
) -> None:
    """--precision int8 on an fp32 directory started the job, and each task's model load failed."""
    (tmp_path / "in.txt").write_text("张艺谋执导了《红高粱》。\n", encoding="utf-8")
    options = spo_spark.SparkExtractOptions(
        inputs=(str(tmp_path / "in.txt"),), output=str(tmp_path / "out"), precision="int8"
    )
    with pytest.raises(spo_spark.SparkExtractError, match="precision int8 needs an int8 model"):
        spo_spark.run_spark_extract(spark, options)
    assert not (tmp_path / "out").exists()


def test_spark_extract_output_that_cannot_be_written_is_one_line(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked through Hadoop before the job (a probe directory beside the output, removed); and a
    job that fails all the same ends in one line naming the innermost Java cause, not a py4j
    traceback."""
    data = tmp_path / "in.txt"
    data.write_text("张艺谋执导了《红高粱》。\n", encoding="utf-8")
    (tmp_path / "notes.md").write_text("keep\n")
    under_a_file = tmp_path / "notes.md" / "out"
    problem = spo_spark.output_problem(spark, str(under_a_file), (str(data),), force=False)
    assert problem is not None and problem.startswith(f"cannot write {under_a_file}: ")
    assert "ParentNotDirectoryException" in problem
    assert spo_spark.output_problem(spark, str(tmp_path / "new"), (str(data),), False) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "notes.md"]
    monkeypatch.setattr(spo_spark, "output_problem", lambda *args: None)
    options = spo_spark.SparkExtractOptions(
        inputs=(str(data),), output=str(under_a_file), model_dir=DEFAULT_MODEL_DIR
    )
    with pytest.raises(spo_spark.SparkExtractError) as failed:
        spo_spark.run_spark_extract(spark, options)
    assert str(failed.value).startswith("the Spark job failed: ")
    assert "Parent path is not a directory" in str(failed.value)
    assert "\n" not in str(failed.value) and (tmp_path / "notes.md").read_text() == "keep\n"


def test_spark_extract_bad_master_is_one_line(tmp_path: Path) -> None:
    spo = Path(sys.executable).with_name("spo")
    (tmp_path / "in.txt").write_text("a\n")
    result = subprocess.run(
        [
            str(spo),
            "spark-extract",
            str(tmp_path / "in.txt"),
            str(tmp_path / "o"),
            "--master",
            "nowhere://x",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Error: cannot start Spark with master 'nowhere://x'" in result.stderr
    assert "Traceback" not in result.stderr


def test_spark_pack_model_is_self_contained_and_named_by_content(
    make_model_dir: Any, tmp_path: Path
) -> None:
    from nlp.manifest import load_manifest

    model = make_model_dir()  # its model.json names a vocab outside the directory (absolute path)
    assert Path(json.loads((model / "model.json").read_text())["vocab"]["path"]).is_absolute()
    shipped = spo_spark.pack_model(model, tmp_path / "archives")
    assert spo_spark.pack_model(model, tmp_path / "archives") == shipped  # same content, same file
    assert shipped.name == shipped.archive.name and shipped.tree_sha256[:12] in shipped.name
    unpacked = tmp_path / "unpacked"
    with tarfile.open(shipped.archive) as tar:
        tar.extractall(unpacked, filter="data")
    doc = json.loads((unpacked / "model.json").read_text(encoding="utf-8"))
    assert doc["vocab"]["path"] == "vocab.txt" and (unpacked / "vocab.txt").is_file()
    assert load_manifest(unpacked).vocab_path == (unpacked / "vocab.txt").resolve()
    assert spo_spark.tree_sha256(unpacked) == shipped.tree_sha256
    with (unpacked / "vocab.txt").open("a", encoding="utf-8") as fh:
        fh.write("[extra]\n")  # a changed file changes the hash the executors check
    assert spo_spark.tree_sha256(unpacked) != shipped.tree_sha256
    assert (model / "model.json").read_text() != (unpacked / "model.json").read_text()
    with pytest.raises(spo_spark.SparkExtractError, match="cannot load the model"):
        spo_spark.pack_model(tmp_path / "nowhere", tmp_path / "archives")


def test_spark_ship_model_carries_the_vocab_of_an_old_layout_directory(tmp_path: Path) -> None:
    """Issue 19: a directory that names the project's vocab/vocab.txt ships with it inside."""
    from types import SimpleNamespace

    from nlp.manifest import load_manifest

    old = tmp_path / "old"
    shutil.copytree(DEFAULT_MODEL_DIR, old)
    (old / "vocab.txt").unlink()
    doc = json.loads((old / "model.json").read_text(encoding="utf-8"))
    doc["vocab"]["path"] = "vocab/vocab.txt"
    (old / "model.json").write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    added: list[str] = []
    fake = SimpleNamespace(
        sparkContext=SimpleNamespace(applicationId="app-old-layout", addArchive=added.append)
    )
    shipped = spo_spark.ship_model(fake, old)  # type: ignore[arg-type]
    assert added == [str(shipped.archive)]
    unpacked = tmp_path / "unpacked"
    with tarfile.open(shipped.archive) as tar:
        tar.extractall(unpacked, filter="data")
    assert load_manifest(unpacked).vocab_path == (unpacked / "vocab.txt").resolve()


def test_spark_extract_links_utf16_and_a_failed_force_keep_everything(
    spark: Any, tmp_path: Path, triples_model_dir: Path
) -> None:
    """An output reached through a link to an input (or inside one) was accepted, and --force
    then replaced the input; a UTF-16 file gave an error row per line (and one more for its last
    NUL); a --force run whose job failed had deleted the earlier output before its first task."""
    import shutil

    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("张艺谋执导了《红高粱》。\n", encoding="utf-8")
    (tmp_path / "link").symlink_to(data)

    def problem(output: Path, inputs: tuple[str, ...]) -> Any:
        return spo_spark.output_problem(spark, str(output), inputs, force=True)

    assert "is inside the input" in problem(data / "out", (str(tmp_path / "link"),))
    assert "is (or holds) the input" in problem(tmp_path / "link", (str(data / "in.txt"),))
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "u16.txt").write_bytes("\ufeff张三在北京\n李四\n".encode("utf-16"))
    with pytest.raises(spo_spark.SparkExtractError, match=r"u16\.txt is UTF-16 or UTF-32"):
        spo_spark.read_records(spark, (str(wide),))
    earlier = tmp_path / "earlier"
    options = spo_spark.SparkExtractOptions(inputs=(str(data),), output=str(earlier))
    assert spo_spark.run_spark_extract(spark, options).records == 1
    before = sorted(p.name for p in earlier.iterdir())
    broken = tmp_path / "broken"
    shutil.copytree(triples_model_dir, broken)
    for weights in (broken / "variables").glob("variables.data-*"):
        weights.write_bytes(weights.read_bytes()[:100])  # the executors fail to load it
    again = dataclasses.replace(options, model_dir=broken, force=True)
    with pytest.raises(spo_spark.SparkExtractError, match=r"^the Spark job failed"):
        spo_spark.run_spark_extract(spark, again)
    assert sorted(p.name for p in earlier.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "broken",
        "data",
        "earlier",
        "link",
        "wide",
    ]  # fmt: skip: no staging directory left behind
    replaced = dataclasses.replace(options, force=True)
    assert spo_spark.run_spark_extract(spark, replaced).records == 1
    assert part_lines(earlier) and sorted(p.name for p in tmp_path.iterdir())[2] == "earlier"
