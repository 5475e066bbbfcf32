import fcntl
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main
from nlp import engine

EVERYDAY = "tests/training/data/everyday.jsonl"


def test_evaluate_reports_scores_at_the_chosen_precision(triples_model_dir, tmp_path):
    data = tmp_path / "one.jsonl"
    data.write_text(
        json.dumps({"text": "张三出生于北京。", "triples": []}, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(
        main, ["evaluate", str(data), "--model", str(triples_model_dir), "--precision", "fp32"]
    )
    assert result.exit_code == 0, result.output
    scores = json.loads(result.output.strip().splitlines()[-1])
    assert {"precision", "recall", "f1"} <= set(scores)


def _write_records(path, records):
    path.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8"
    )
    return path


TAGGED = [
    {"text": "张三出生于北京。", "triples": [["张三", "出生地", "北京"]], "patterns": ["plain"]},
    {
        "text": "《长夜》由韩冰执导，作者是李四。",
        "triples": [["长夜", "导演", "韩冰"], ["长夜", "作者", "李四"]],
        "patterns": ["you_by", "multi_fact"],
    },
    {"text": "今天天气很好。", "triples": [], "patterns": ["no_fact"]},
]


def test_evaluate_errors_never_replace_the_data(triples_model_dir, tmp_path):
    data = _write_records(tmp_path / "tagged.jsonl", TAGGED)
    before = data.read_bytes()
    args = ["evaluate", str(data), "--model", str(triples_model_dir), "--errors"]
    result = CliRunner().invoke(main, [*args, str(tmp_path / "." / "tagged.jsonl")])
    assert (
        result.exit_code == 2 and "writing the errors there would replace the data" in result.output
    )
    assert data.read_bytes() == before
    # Nor its staging file: data named .NAME.partial was emptied, then removed.
    staged = _write_records(tmp_path / ".e.jsonl.partial", TAGGED)
    staged_args = ["evaluate", str(staged), "--model", str(triples_model_dir), "--errors"]
    result = CliRunner().invoke(main, [*staged_args, str(tmp_path / "e.jsonl")])
    assert result.exit_code == 2 and "the data would be emptied" in result.output
    assert staged.read_bytes() == before
    result = CliRunner().invoke(main, [*args, str(tmp_path / "errors.jsonl")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "errors.jsonl").read_text(encoding="utf-8").count("\n") >= 1  # 导演 missed


def test_evaluate_errors_refuses_what_it_would_replace_and_where_it_cannot_write(
    triples_model_dir, tmp_path, monkeypatch
):
    import training.evaluate

    data = _write_records(tmp_path / "tagged.jsonl", TAGGED)
    args = ["evaluate", str(data), "--model", str(triples_model_dir), "--errors"]
    mine = tmp_path / "mine.jsonl"
    mine.write_text("my notes\n", encoding="utf-8")
    result = CliRunner().invoke(main, [*args, str(mine)])
    assert result.exit_code == 2 and "exists (use --force to replace it)" in result.output
    assert mine.read_text(encoding="utf-8") == "my notes\n"
    result = CliRunner().invoke(main, [*args, str(tmp_path)])
    assert result.exit_code == 2  # a directory: click's own check
    # A path that cannot be written is named before the model runs (was: a traceback after it).
    ran = []
    monkeypatch.setattr(training.evaluate, "evaluate", lambda *a, **k: ran.append(1))
    blocker = tmp_path / "blocker"
    blocker.write_text("", encoding="utf-8")
    result = CliRunner().invoke(main, [*args, str(blocker / "errors.jsonl")])
    assert result.exit_code == 1 and result.output.startswith(f"Error: cannot write {blocker}")
    assert "Traceback" not in result.output and ran == []
    monkeypatch.undo()
    result = CliRunner().invoke(main, [*args, str(mine), "--force"])
    assert result.exit_code == 0, result.output
    assert json.loads(mine.read_text(encoding="utf-8").splitlines()[0])["text"]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


def test_evaluate_errors_failed_run_leaves_no_new_folder(triples_model_dir, tmp_path):
    """``--errors new/dir/errors.jsonl`` made the folders before the evaluation; one that then
    failed (a malformed data file here) left them behind, empty."""
    data = tmp_path / "bad.jsonl"
    data.write_text("{not json\n", encoding="utf-8")
    errors = tmp_path / "new" / "dir" / "errors.jsonl"
    args = ["evaluate", str(data), "--model", str(triples_model_dir), "--errors", str(errors)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
    # A folder that was there before stays, and the run that succeeds keeps what it made.
    (tmp_path / "kept").mkdir()
    good = _write_records(tmp_path / "tagged.jsonl", TAGGED)
    args = ["evaluate", str(good), "--model", str(triples_model_dir), "--errors"]
    assert CliRunner().invoke(main, [*args, str(tmp_path / "kept" / "e.jsonl")]).exit_code == 0
    assert CliRunner().invoke(main, [*args, str(tmp_path / "a" / "b" / "e.jsonl")]).exit_code == 0
    assert (tmp_path / "a" / "b" / "e.jsonl").is_file()
    data.write_text("{not json\n", encoding="utf-8")
    assert (
        CliRunner()
        .invoke(
            main,
            [
                "evaluate",
                str(data),
                "--model",
                str(triples_model_dir),
                "--errors",
                str(tmp_path / "kept" / "x" / "e.jsonl"),
            ],
        )
        .exit_code
    )
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["e.jsonl"]


def test_evaluate_errors_file_is_one_line_per_record_to_any_reader(triples_model_dir, tmp_path):
    """A text with U+2028, U+2029 or U+0085 in it (line breaks to str.splitlines(), not to JSON) is
    still one line of the errors file, as it is one line of spo extract's output."""
    text = "《长夜》由韩冰执导，\u2028作者是李四。\u2029\x85"
    record = {"text": text, "triples": [["长夜", "导演", "韩冰"]]}
    data = _write_records(tmp_path / "breaks.jsonl", [record])
    errors = tmp_path / "errors.jsonl"
    args = ["evaluate", str(data), "--model", str(triples_model_dir), "--errors", str(errors)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    body = errors.read_text(encoding="utf-8")
    assert len(body.splitlines()) == 1  # 导演 is unknown to the tiny model: one error record
    assert json.loads(body)["text"] == text


def test_evaluate_errors_file_has_one_writer_at_a_time(triples_model_dir, tmp_path, monkeypatch):
    """Two runs writing one --errors file at once would share its temporary file; the second is
    refused before its model runs, and the first one's file is left to it."""
    import training.evaluate

    data = _write_records(tmp_path / "tagged.jsonl", TAGGED)
    errors = tmp_path / "errors.jsonl"
    partial = tmp_path / ".errors.jsonl.partial"
    partial.write_text("the other run's lines\n", encoding="utf-8")
    ran = []
    monkeypatch.setattr(training.evaluate, "evaluate", lambda *a, **k: ran.append(1))
    args = ["evaluate", str(data), "--model", str(triples_model_dir), "--errors", str(errors)]
    with partial.open("rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "is being written by another run" in result.output
    assert ran == [] and not errors.exists()
    assert partial.read_text(encoding="utf-8") == "the other run's lines\n"
    monkeypatch.undo()
    # Unlocked, it is a killed run's leftover: replaced, then renamed.
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert not partial.exists() and "the other run" not in errors.read_text(encoding="utf-8")


def test_evaluate_reports_scores_per_predicate_and_per_pattern(triples_model_dir, tmp_path):
    data = _write_records(tmp_path / "tagged.jsonl", TAGGED)
    result = CliRunner().invoke(main, ["evaluate", str(data), "--model", str(triples_model_dir)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output.strip().splitlines()[-1])
    by_predicate, by_pattern = doc["by_predicate"], doc["by_pattern"]
    # Every predicate of the gold is listed, the model's own (出生地, 妻子, 作者) in their order
    # first; 导演 is unknown to the tiny model, so it is never predicted.
    assert {"出生地", "作者", "导演"} <= set(by_predicate)
    assert by_predicate["导演"]["gold"] == 1 and by_predicate["导演"]["predicted"] == 0
    assert list(by_predicate)[-1] == "导演"
    for key in ("gold", "predicted", "correct"):
        assert sum(s[key] for s in by_predicate.values()) == doc[key]
    assert list(by_pattern) == ["plain", "you_by", "multi_fact", "no_fact"]
    assert [by_pattern[k]["records"] for k in by_pattern] == [1, 1, 1, 1]
    assert [by_pattern[k]["gold"] for k in by_pattern] == [1, 2, 2, 0]


def test_evaluate_text_format_prints_the_tables(triples_model_dir, tmp_path):
    data = _write_records(tmp_path / "tagged.jsonl", TAGGED)
    args = ["evaluate", str(data), "--model", str(triples_model_dir), "--format", "text"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    firsts = [line.split()[0] for line in result.output.splitlines() if line.strip()]
    assert firsts[1:3] == ["records", "all"]
    assert "predicate" in firsts and "pattern" in firsts and "导演" in firsts
    assert firsts[-4:] == ["plain", "you_by", "multi_fact", "no_fact"]


def test_evaluate_reports_scores_per_type_for_an_entities_model(entities_model_dir, tmp_path):
    data = _write_records(tmp_path / "tagged.jsonl", TAGGED)
    result = CliRunner().invoke(main, ["evaluate", str(data), "--model", str(entities_model_dir)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output.strip().splitlines()[-1])
    assert "by_predicate" not in doc and set(doc["by_type"]) >= {"人物", "地点"}
    assert sum(s["gold"] for s in doc["by_type"].values()) == doc["gold"]
    assert list(doc["by_pattern"]) == ["plain", "you_by", "multi_fact", "no_fact"]


def test_evaluate_refuses_a_bad_record_naming_its_line(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(
        '{"text": "张三出生于北京。", "triples": []}\n{"text": "x", "patterns": "plain"}\n'
    )
    result = CliRunner().invoke(main, ["evaluate", str(data)])
    assert result.exit_code == 1
    assert "line 2: neither 'triples' nor 'entities'" in result.output
    assert "Traceback" not in result.output


def test_evaluate_text_format_is_for_one_model(triples_model_dir):
    args = ["evaluate", EVERYDAY, "--model", str(triples_model_dir), "--format", "text"]
    result = CliRunner().invoke(main, [*args, "--baseline", str(triples_model_dir)])
    assert result.exit_code == 2 and "--format text is for one model" in result.output


def test_evaluate_refuses_bf16_on_a_cpu_without_it(triples_model_dir, monkeypatch):
    monkeypatch.setattr(engine, "cpu_supports_bf16", lambda: False)
    result = CliRunner().invoke(
        main, ["evaluate", EVERYDAY, "--model", str(triples_model_dir), "--precision", "bf16"]
    )
    assert result.exit_code == 1
    assert "bf16" in result.output and "Traceback" not in result.output


def test_modelcli_train_defaults_are_train_config_defaults():
    from training.config import TrainConfig

    params = {p.name: p.default for p in main.commands["train"].params}
    assert params["epochs"] == TrainConfig.epochs and params["lr"] == TrainConfig.learning_rate
    assert params["warmup"] == TrainConfig.warmup_steps
    assert params["max_minutes"] == TrainConfig.max_minutes and params["seed"] == TrainConfig.seed


def test_modelcli_make_corpus_writes_the_generator_output(tmp_path):
    from training.corpus import write_corpus

    result = CliRunner().invoke(main, ["make-corpus", str(tmp_path / "a.jsonl"), "--n", "30"])
    assert result.exit_code == 0, result.output
    write_corpus(tmp_path / "b.jsonl", 30, seed=1)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_modelcli_make_corpus_writes_to_stdout_with_a_dash(tmp_path, monkeypatch):
    from training.corpus import write_corpus

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["make-corpus", "-", "--n", "30", "--seed", "4"])
    assert result.exit_code == 0, result.output
    write_corpus(tmp_path / "b.jsonl", 30, seed=4)
    assert result.stdout_bytes == (tmp_path / "b.jsonl").read_bytes()
    assert result.stderr == "-: 30 records (seed 4, train names)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.jsonl"]  # no file named "-"


def test_modelcli_make_corpus_adds_the_hand_written_sentences_after_the_generated(
    tmp_path, monkeypatch
):
    from training.corpus import hand_written_records, write_corpus

    out = tmp_path / "a.jsonl"
    result = CliRunner().invoke(main, ["make-corpus", str(out), "--n", "30", "--hand-written", "2"])
    assert result.exit_code == 0, result.output
    written = hand_written_records()
    summary = f"30 records (seed 1, train names) and {2 * len(written)} hand-written\n"
    assert result.output == f"{out}: {summary}"
    write_corpus(tmp_path / "b.jsonl", 30, seed=1)
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    assert "".join(lines[:30]) == (tmp_path / "b.jsonl").read_text(encoding="utf-8")
    assert [json.loads(x)["text"] for x in lines[30:]] == [r.text for r in written] * 2
    assert set(json.loads(lines[30])) == {"text", "triples", "entities"}

    monkeypatch.chdir(tmp_path)  # and to stdout, the summary on stderr
    result = CliRunner().invoke(main, ["make-corpus", "-", "--n", "30", "--hand-written", "2"])
    assert result.exit_code == 0 and result.stdout_bytes == out.read_bytes()
    assert result.stderr == f"-: {summary}"


def test_modelcli_make_corpus_says_so_when_the_hand_written_sentences_cannot_be_read(
    tmp_path, monkeypatch
):
    import training.corpus

    def unreadable() -> list:
        raise FileNotFoundError(2, "No such file or directory", "handwritten.jsonl")

    monkeypatch.setattr(training.corpus, "hand_written_records", unreadable)
    out = tmp_path / "a.jsonl"
    for target in (str(out), "-"):
        args = ["make-corpus", target, "--n", "30", "--hand-written", "1"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1, result.output
        assert "cannot read the hand-written training sentences" in result.stderr
        assert "handwritten.jsonl" in result.stderr and result.stdout == ""
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_modelcli_make_corpus_refuses_hand_written_sentences_for_a_held_out_set(tmp_path):
    out = tmp_path / "h.jsonl"
    args = ["make-corpus", str(out), "--n", "3", "--split", "heldout", "--hand-written", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "--split train" in result.output
    assert not out.exists()


def test_modelcli_make_corpus_to_a_closed_pipe_stops_quietly(tmp_path):
    spo = Path(sys.executable).with_name("spo")
    done = subprocess.run(
        f"{spo} make-corpus - --n 5000 | head -n 2",
        shell=True,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert len(done.stdout.splitlines()) == 2 and done.stdout.startswith('{"text": ')
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_modelcli_make_corpus_never_replaces_a_file_unasked_nor_leaves_half_a_corpus(
    tmp_path, monkeypatch
):
    import training.corpus

    out = tmp_path / "train.jsonl"
    out.write_text('{"text": "my labelled data", "triples": []}\n', encoding="utf-8")
    before = out.read_bytes()
    result = CliRunner().invoke(main, ["make-corpus", str(out), "--n", "3"])
    assert result.exit_code == 2 and "exists (use --force to replace it)" in result.output
    assert out.read_bytes() == before

    def interrupted(path, n, seed, split="train", extra=()):
        path.write_text('{"text": "half"}\n', encoding="utf-8")
        raise KeyboardInterrupt

    monkeypatch.setattr(training.corpus, "write_corpus", interrupted)
    result = CliRunner().invoke(main, ["make-corpus", str(out), "--n", "3", "--force"])
    assert result.exit_code == 1 and "Aborted" in result.output
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    monkeypatch.undo()
    result = CliRunner().invoke(main, ["make-corpus", str(out), "--n", "3", "--force"])
    assert result.exit_code == 0, result.output
    assert len(out.read_text(encoding="utf-8").splitlines()) == 3
    result = CliRunner().invoke(main, ["make-corpus", str(out / "x.jsonl"), "--n", "3"])
    assert result.exit_code == 1 and result.output.startswith(f"Error: cannot write {out}")
    assert "Traceback" not in result.output


def test_modelcli_make_corpus_without_the_training_extra_names_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "faker", None)  # what a serving-only install is
    monkeypatch.delitem(sys.modules, "training.corpus", raising=False)
    result = CliRunner().invoke(main, ["make-corpus", str(tmp_path / "a.jsonl"), "--n", "3"])
    assert result.exit_code == 1
    assert "faker is missing" in result.output and "spo-service[training]" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "a.jsonl").exists()


def _captured_train(tmp_path, monkeypatch):
    """``spo train`` with training replaced by a recorder: (what it was given, a corpus path)."""
    import training.train

    seen = {}
    monkeypatch.setattr(training.train, "train", lambda config: seen.setdefault("c", config))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("{}\n", encoding="utf-8")
    return seen, corpus


def test_modelcli_train_hidden_size_reaches_the_encoder(tmp_path, monkeypatch):
    """--hidden-size widens the encoder (feed-forward 4x); a width the heads cannot split is a
    usage error, before anything is trained."""
    import training.config

    seen, corpus = _captured_train(tmp_path, monkeypatch)
    ok = CliRunner().invoke(main, ["train", str(corpus), "--out", str(tmp_path / "m"),
                                   "--hidden-size", "160"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert seen["c"].bert_config["hidden_size"] == 160
    assert seen["c"].bert_config["intermediate_size"] == 640
    bad = CliRunner().invoke(main, ["train", str(corpus), "--hidden-size", "130"])
    assert bad.exit_code == 2 and "multiple of the 4 attention heads" in bad.output
    defaults = {p.name: p.default for p in main.commands["train"].params}
    assert defaults["hidden_size"] == training.config.DEMO_BERT_CONFIG["hidden_size"]


@pytest.mark.parametrize(
    ("flag", "value", "field", "expected", "default", "bad", "refusal"),
    [
        ("--ema", "0.999", "ema", 0.999, 0.0, "1", "0<=x<=0.9999"),  # off unless asked for
        # The window served, within the 128 positions trained with (None: max_length's 128).
        ("--serve-length", "96", "serve_length", 96, None, "129", "3<=x<=128"),
    ],
)
def test_modelcli_train_option_reaches_the_config_and_refuses_out_of_range(
    tmp_path, monkeypatch, flag, value, field, expected, default, bad, refusal
):
    seen, corpus = _captured_train(tmp_path, monkeypatch)
    args = ["train", str(corpus), "--out", str(tmp_path / "m")]
    ok = CliRunner().invoke(main, [*args, flag, value])
    assert ok.exit_code == 0, ok.output
    assert getattr(seen.pop("c"), field) == expected
    ok = CliRunner().invoke(main, args)
    assert ok.exit_code == 0 and getattr(seen["c"], field) == default, ok.output
    refused = CliRunner().invoke(main, ["train", str(corpus), flag, bad])
    assert refused.exit_code == 2 and flag in refused.output and refusal in refused.output


def test_modelcli_link_rule_reaches_the_config_for_triples_only(tmp_path, monkeypatch):
    """--link-rule is a triples model's decoding rule: it reaches the config, shows its choices,
    and an NER model (or an NER schema on export) refuses one other than the default."""
    seen, corpus = _captured_train(tmp_path, monkeypatch)
    ok = CliRunner().invoke(main, ["train", str(corpus), "--out", str(tmp_path / "m"),
                                   "--link-rule", "mean"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert seen.pop("c").link_rule == "mean"
    ok = CliRunner().invoke(main, ["train", str(corpus), "--out", str(tmp_path / "m")])
    assert ok.exit_code == 0 and seen["c"].link_rule == "both", ok.output
    bad = CliRunner().invoke(main, ["train", str(corpus), "--link-rule", "max"])
    assert bad.exit_code == 2 and "'max' is not one of 'both', 'mean'" in bad.output, bad.output
    ner = CliRunner().invoke(main, ["train", str(corpus), "--task", "entities",
                                    "--link-rule", "mean"])  # fmt: skip
    assert ner.exit_code == 2 and "a link rule is for triples models" in ner.output, ner.output
    types = tmp_path / "types.json"
    types.write_text('["人物", "地点"]', encoding="utf-8")
    ner = CliRunner().invoke(main, ["export", "--bert-config", str(corpus), "--weights", "w",
                                    "--schema", str(types), "--out", str(tmp_path / "x"),
                                    "--link-rule", "mean"])  # fmt: skip
    assert ner.exit_code == 1 and "a link rule is for triples models" in ner.output, ner.output
    assert "Traceback" not in ner.output


def test_modelcli_train_threshold_reaches_the_config(tmp_path, monkeypatch):
    """--threshold is what the trained model.json will hold; a threshold that is no finite number
    is a usage error before an hour of training, not a model that cannot load after it."""
    seen, corpus = _captured_train(tmp_path, monkeypatch)
    ok = CliRunner().invoke(main, ["train", str(corpus), "--out", str(tmp_path / "m"),
                                   "--threshold", "-1.5"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert seen["c"].threshold == -1.5
    for bad_value in ("nan", "inf", "-inf"):
        bad = CliRunner().invoke(main, ["train", str(corpus), "--threshold", bad_value])
        assert bad.exit_code == 2 and "threshold must be a finite number" in bad.output, bad.output
        bad = CliRunner().invoke(main, ["export", "--bert-config", str(corpus), "--weights", "w",
                                        "--schema", str(corpus), "--out", str(tmp_path / "x"),
                                        "--threshold", bad_value])  # fmt: skip
        assert bad.exit_code == 2 and "not a finite number" in bad.output, bad.output


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lr", "nan"], "--lr must be a positive finite number, got nan"),
        (["--lr", "0"], "--lr must be a positive finite number, got 0.0"),
        (["--lr", "-1e-3"], "--lr must be a positive finite number"),
        (["--lr", "inf"], "--lr must be a positive finite number, got inf"),
        (["--max-minutes", "0"], "--max-minutes must be a positive finite number"),
        (["--max-minutes", "nan"], "--max-minutes must be a positive finite number"),
        (["--dropout", "nan"], "--dropout must be 0 to 0.9, got nan"),
        (["--token-noise", "nan"], "--token-noise must be 0 to 0.5, got nan"),
        (["--ema", "nan"], "--ema must be 0 to 0.9999, got nan"),
    ],
)
def test_modelcli_train_refuses_what_click_ranges_let_through(
    tmp_path, monkeypatch, flags, message
):
    """NaN passes any click range, and a rate of 0 or below trains nothing (NaN: a model of NaN
    weights); each is a usage error naming it, before the corpus is read or anything trained."""
    seen, corpus = _captured_train(tmp_path, monkeypatch)
    bad = CliRunner().invoke(main, ["train", str(corpus), "--out", str(tmp_path / "m"), *flags])
    assert bad.exit_code == 2 and message in bad.output, bad.output
    assert "Traceback" not in bad.output and "c" not in seen


@pytest.mark.timeout(300)  # the empty file once looped for ever: fail, do not hang
def test_modelcli_train_refuses_bad_data_naming_the_line_before_training(tmp_path):
    """A corpus spo train cannot learn from is refused in one line, nothing trained or written:
    an empty file (once an endless loop), bytes that are not UTF-8, a line that is not a record, a
    predicate (an entity type) the model has no head for, an argument that is not in its text."""
    good = '{"text": "张三出生于北京。", "triples": [["张三", "出生地", "北京"]]}\n'
    cases = [
        ("", [], "no records (the file is empty or blank)"),
        (good + "\xff\n", [], "line 2: not UTF-8"),
        (good + "[1]\n", [], "line 2: not a JSON object"),
        (good + '{"text": "张三的籍贯是北京", "triples": [["张三", "老家", "北京"]]}\n', [],
         "line 2: predicate '老家' is not one of the model's 24 predicates"),
        ('{"text": "张三出生于北京。", "triples": [["张三", "出生地", "上海"]]}\n', [],
         "line 1: triple [张三, 出生地, 上海]: '上海' is not in the text"),
        ('{"text": "北京", "entities": [["北京", "城市"]]}\n', ["--task", "entities"],
         "line 1: entity type '城市' is not one of the model's"),
    ]  # fmt: skip
    for number, (content, options, message) in enumerate(cases):
        corpus = tmp_path / f"c{number}.jsonl"
        corpus.write_bytes(content.encode("utf-8").replace(b"\xc3\xbf", b"\xff"))
        out = tmp_path / f"m{number}"
        args = ["train", str(corpus), "--out", str(out), "--max-steps", "1", *options]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1, result.output
        assert message in result.output and "Traceback" not in result.output, result.output
        assert not out.exists()


def test_evaluate_refuses_a_baseline_of_another_task(triples_model_dir, entities_model_dir):
    """A triples model against an entities baseline once printed F1 0 for the baseline and 0%
    identical texts, as if it were a result; the two share no result to compare."""
    args = ["evaluate", EVERYDAY, "--model", str(triples_model_dir)]
    result = CliRunner().invoke(main, [*args, "--baseline", str(entities_model_dir)])
    assert result.exit_code == 1, result.output
    assert "answers triples and the baseline" in result.output
    assert "answers entities: compare two models of one task" in result.output
    assert "Traceback" not in result.output


def test_converter_file_system_errors_name_the_right_path(tmp_path):
    """A failure inside a converter's staging folder (gone by the time it is reported) names the
    output; an input that cannot be read is named as itself, not as something written."""
    from app.cli.model import _conversion_failed

    out = tmp_path / "int8"
    staged = tmp_path / ".int8.x1y2" / "model" / "model.onnx"
    full = OSError(28, "No space left on device", str(staged))
    assert _conversion_failed(out, full).message == f"cannot write {out}: No space left on device"
    unreadable = OSError(13, "Permission denied", str(tmp_path / "calib.txt"))
    assert (
        _conversion_failed(out, unreadable).message
        == f"{tmp_path / 'calib.txt'}: Permission denied"
    )
    raced = FileExistsError(f"{out} exists (use --force to replace it)")
    assert _conversion_failed(out, raced).message == f"{out} exists (use --force to replace it)"


def test_train_a_failure_of_the_file_system_at_the_end_is_one_line(tmp_path, monkeypatch):
    """A full disk while the model was written ended the run in a traceback (an OSError, or
    TensorFlow's ResourceExhaustedError, now turned into one by the export)."""
    import training.train

    def full(config):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(training.train, "train", full)
    data = tmp_path / "c.jsonl"
    data.write_text('{"text": "张三出生于北京。", "triples": [["张三", "出生地", "北京"]]}\n')
    out = tmp_path / "model"
    result = CliRunner().invoke(main, ["train", str(data), "--out", str(out)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.endswith(f"Error: cannot write {out}: No space left on device\n")


@pytest.mark.parametrize(
    "args",
    [["--warmup", "1" + "0" * 400], ["--max-steps", "10000001"], ["--hidden-size", "400000"],
     ["--seed", "-5"]],
)  # fmt: skip
def test_train_refuses_numbers_out_of_range_before_training(tmp_path, args):
    """A 400-digit --warmup reached TensorFlow ("out-of-range integer to Tensor") after the corpus
    was read; --hidden-size 400000 ran the machine out of memory."""
    data = tmp_path / "c.jsonl"
    data.write_text('{"text": "张三出生于北京。", "triples": [["张三", "出生地", "北京"]]}\n')
    result = CliRunner().invoke(main, ["train", str(data), "--out", str(tmp_path / "m"), *args])
    assert result.exit_code == 2 and "Invalid value for" in result.output
    assert not (tmp_path / "m").exists()


def test_modelcli_make_corpus_killed_leaves_no_partial_file(tmp_path):
    """SIGTERM (a container stopped) left a 6 MB ``.c.jsonl.partial``; Ctrl-C did not."""
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("faker")
    out = tmp_path / "c.jsonl"
    partial = tmp_path / ".c.jsonl.partial"
    spo = Path(sys.executable).with_name("spo")
    process = subprocess.Popen(
        [str(spo), "make-corpus", str(out), "--n", "2000000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (partial.exists() and partial.stat().st_size > 0):
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 128 + signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()
    assert list(tmp_path.iterdir()) == []


def test_modelcli_evaluate_errors_never_go_into_a_model_directory(tmp_path, triples_model_dir):
    """``--errors MODEL/model.json --force`` replaced the model.json of the model being scored."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(triples_model_dir, model)
    before = (model / "model.json").read_bytes()
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "x", "triples": []}\n', encoding="utf-8")
    args = ["evaluate", str(data), "--model", str(model), "--errors", str(model / "model.json")]
    result = CliRunner().invoke(main, [*args, "--force"])
    assert result.exit_code == 2 and "is inside the model directory" in result.output
    assert (model / "model.json").read_bytes() == before
