"""``spo export``: every flag reaches ``training.export.export_user_model`` (the command passes its
options through by name)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from app.cli import main
from nlp.manifest import load_manifest
from tests.conftest import TINY_PREDICATES, _vocab_tokens


def test_modelcli_export_passes_every_flag(tmp_path: Path, vocab_path: Path) -> None:
    import nlp  # noqa: F401  (TF_KERAS before TensorFlow)
    from training.gplinker import TINY_BERT_CONFIG, build_gplinker

    config = {**TINY_BERT_CONFIG, "vocab_size": len(_vocab_tokens())}
    weights = tmp_path / "best_model.weights.h5"
    build_gplinker(config, len(TINY_PREDICATES), head_size=16).save_weights(str(weights))
    (tmp_path / "bert_config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "schema.json").write_text(json.dumps(TINY_PREDICATES), encoding="utf-8")
    out = tmp_path / "exported"
    args = ["export", "--bert-config", str(tmp_path / "bert_config.json"), "--weights", str(weights),
            "--schema", str(tmp_path / "schema.json"), "--vocab", str(vocab_path), "--out", str(out),
            "--head-size", "16", "--max-length", "16", "--name", "mine", "--model-version", "7",
            "--threshold", "0.5", "--cased", "--mode", "graph"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"model written to {out}" in result.output
    manifest = load_manifest(out)
    assert (manifest.name, manifest.version, manifest.threshold) == ("mine", "7", 0.5)
    assert manifest.max_length == 16 and manifest.do_lower_case is False
    assert manifest.input_names == ("Input-Token:0", "Input-Segment:0")  # graph mode
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1 and "exists (use --force" in again.output
