"""Issue 24 part 3: the TF session's opt-ins (``SPO_SHORT_CALL_THREADS``, ``SPO_EXTRA_REWRITES``; ``spo
extract --short-call-threads --extra-rewrites``) served end to end: the service and the batch command
load the model with them and answer what they answer without them.

The int8 directory is the tiny model (biases and gains jittered, as after training, so that the Q/K/V
fusion has bias-adds to match) marked int8 in its model.json, as ``spo quantize`` marks its output;
the int8 path runs it frozen with int8 session options, which needs a CPU with VNNI or AMX.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from app import create_app
from app.cli import main
from app.core.settings import Settings
from nlp import engine
from nlp.config import SHORT_CALL_PLANS

TEXTS = ["张三出生于北京", "《霸王别姬》是陈凯歌执导的电影，张国荣、巩俐主演。"]


@pytest.fixture(scope="module")
def int8_dir(make_model_dir, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if (reason := engine.int8_support()) is not None:
        pytest.skip(f"int8 cannot run on this CPU: {reason}")
    source = make_model_dir("triples", seed=11, jitter_constants=True)
    out = tmp_path_factory.mktemp("int8") / "tiny-int8"
    shutil.copytree(source, out)
    doc = json.loads((out / "model.json").read_text(encoding="utf-8"))
    doc.update(precision="int8", quantization={"tool": "test", "tool_version": "0"})
    (out / "model.json").write_text(json.dumps(doc), encoding="utf-8")
    return out


def _served(int8_dir: Path, **variables: str):
    env = {"SPO_MODEL_DIR": str(int8_dir), "SPO_WORKERS": "1", "SPO_INTRA_OP_THREADS": "2"}
    settings = Settings.from_env({**env, **{f"SPO_{k.upper()}": v for k, v in variables.items()}})
    app = create_app(settings)
    client = app.test_client()
    assert client.get("/readyz").status_code == 200
    response = client.post("/v1/extract", json={"texts": TEXTS})
    assert response.status_code == 200, response.get_json()
    return app.extensions["spo"].extractor.runtime, response.get_json()["results"]


def test_tf_opt_ins_served_give_the_same_results_as_without(int8_dir: Path) -> None:
    plain_runtime, plain = _served(int8_dir)
    runtime, results = _served(
        int8_dir, short_call_threads="on", extra_rewrites="fuse_sibling_dense"
    )
    assert plain_runtime.thread_plan == () and "fuse_sibling_dense" not in plain_runtime.rewrites
    assert runtime.thread_plan == SHORT_CALL_PLANS["int8"] and set(runtime._by_threads) == {1}
    assert runtime.rewrites["fuse_sibling_dense"] == 3
    assert runtime.runs > 0 and results == plain
    assert any(r["triples"] or r["entities"] for r in results)  # not two empty answers


def test_tf_opt_ins_spo_extract_flags(int8_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    outputs = []
    for flags in ([], ["--short-call-threads", "--extra-rewrites", "fuse_sibling_dense"]):
        out = tmp_path / f"out{len(outputs)}.jsonl"
        args = ["extract", "--model", str(int8_dir), "--workers", "0", "-q", *flags]
        result = CliRunner().invoke(main, [*args, str(source), "-o", str(out)])
        assert result.exit_code == 0, result.output
        outputs.append(out.read_text(encoding="utf-8"))
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 2
    assert '"error"' not in outputs[0]


def test_tf_opt_ins_spo_extract_refuses_an_unknown_rewrite(int8_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("张三\n", encoding="utf-8")
    result = CliRunner().invoke(
        main, ["extract", "--model", str(int8_dir), "--extra-rewrites", "fuse_qkv", str(source)]
    )
    assert result.exit_code == 2
    assert "unknown rewrite(s) 'fuse_qkv'; known: fuse_sibling_dense" in result.output


def test_tf_opt_ins_batch_options_give_the_thread_plan_its_upper_bound() -> None:
    """In this process (``--workers 0``) the model runs on TensorFlow's default threads, which a
    thread plan cannot bound: with ``--short-call-threads`` it gets the cores instead."""
    from app.batch.runner import BatchOptions
    from app.core.settings import threads_per_worker

    inline = BatchOptions(inputs=("-",), workers=0)
    assert inline.load_options().intra_op_threads is None
    planned = BatchOptions(inputs=("-",), workers=0, short_call_threads=True)
    assert planned.load_options().intra_op_threads == threads_per_worker(1)
    assert planned.load_options().short_call_threads and planned.problems() == []
    bad = BatchOptions(inputs=("-",), extra_rewrites=("qkv",))
    assert bad.problems() == ["--extra-rewrites must be among fuse_sibling_dense, got 'qkv'"]
