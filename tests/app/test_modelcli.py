import json
import sys

from click.testing import CliRunner

from app.cli import main
from nlp import runtime as runtime_module

EVERYDAY = "tests/training/data/everyday.jsonl"


def test_evaluate_reports_scores_at_the_chosen_precision(triples_model_dir, tmp_path):
    data = tmp_path / "one.jsonl"
    data.write_text(
        json.dumps({"text": "张三出生于北京。", "spo_list": []}, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(
        main, ["evaluate", str(data), "--model", str(triples_model_dir), "--precision", "fp32"]
    )
    assert result.exit_code == 0, result.output
    scores = json.loads(result.output.strip().splitlines()[-1])
    assert {"precision", "recall", "f1"} <= set(scores)


def test_evaluate_refuses_bf16_on_a_cpu_without_it(triples_model_dir, monkeypatch):
    monkeypatch.setattr(runtime_module, "cpu_supports_bf16", lambda: False)
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


def test_modelcli_make_corpus_without_the_training_extra_names_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "faker", None)  # what a serving-only install is
    monkeypatch.delitem(sys.modules, "training.corpus", raising=False)
    result = CliRunner().invoke(main, ["make-corpus", str(tmp_path / "a.jsonl"), "--n", "3"])
    assert result.exit_code == 1
    assert "faker is missing" in result.output and "spo-service[training]" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "a.jsonl").exists()
