"""Issue 19: spo-service runs outside its checkout.

A demo model copied anywhere answers as it does in ``models/`` (served and batch); the wheel that
``python -m build --wheel`` makes, installed in a fresh venv with bert4keras beside it as README says,
answers the README examples byte for byte from a directory that is not the checkout, through
``spo extract``, ``spo serve`` and ``spo serve --nginx``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from app import create_app
from app.cli import main
from app.core.settings import Settings, SettingsError
from nlp.config import packaged_model_dir
from tests import PROJECT_ROOT
from tests.app.test_live import NGINX, call, free_port, wait_ready

README = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
# The README's first curl example (the default model) and its first `spo extract` example.
CURL = re.search(r"-d '(\{.*?\})'\n(\{.*\})\n", README)
EXTRACT = re.search(r'\$ echo "(.*?)" \| \S*spo extract - 2>/dev/null\n(\{.*\})\n', README)
TEXTS = [
    "《霸王别姬》是陈凯歌执导的电影，张国荣、巩俐主演。",
    "鲁迅原名周树人，1881年9月25日出生于浙江绍兴。",
    "马云创办了阿里巴巴，公司总部位于杭州。",
    "《平凡的世界》是路遥创作的长篇小说。" * 20,  # over max_length: windows
]


def test_install_readme_examples_found() -> None:
    assert CURL is not None and EXTRACT is not None


def _extract(model_dir: Path, source: Path, out: Path) -> list[dict[str, Any]]:
    args = ["extract", str(source), "-o", str(out), "--model", str(model_dir), "--workers", "0"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["demo", "ner"])
def test_install_demo_model_copied_outside_the_checkout_answers_the_same(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = packaged_model_dir(name)
    copy = tmp_path / "elsewhere" / name
    shutil.copytree(original, copy)
    assert PROJECT_ROOT not in copy.resolve().parents
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    source = work / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")

    expected = _extract(original, source, work / "from-models.jsonl")
    assert sum(len(r["entities"]) for r in expected) > 0
    assert _extract(copy, source, work / "from-copy.jsonl") == expected

    app = create_app(Settings(model_dir=copy, workers=1, intra_op_threads=1))
    client = app.test_client()
    for text, record in zip(TEXTS, expected, strict=True):
        response = client.post("/v1/extract", json={"text": text})
        assert response.status_code == 200
        body = response.get_json()
        assert body["model"]["name"] == name
        (result,) = body["results"]
        assert result == {"entities": record["entities"], "triples": record["triples"]}


# --- the wheel, installed outside the checkout -----------------------------------------------------


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(argv, capture_output=True, timeout=900, **kwargs)
    assert proc.returncode == 0, (argv, proc.stderr.decode(errors="replace")[-3000:])
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    """(venv, environment, working directory): the wheel installed as README says."""
    pytest.importorskip("build", reason="the wheel test needs `build` (pip install build==1.6.1)")
    base = tmp_path_factory.mktemp("wheel")
    assert PROJECT_ROOT not in base.resolve().parents
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPO_", "PYTHON", "VIRTUAL"))}
    _run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--outdir",
            str(base / "dist"),
            str(PROJECT_ROOT),
        ],
        env=env,
    )
    (wheel,) = (base / "dist").glob("spo_service-*.whl")
    # `spo make-corpus --hand-written` reads its sentences from the package, not the checkout.
    assert "training/handwritten.jsonl" in zipfile.ZipFile(wheel).namelist()
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], env=env)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run([*pip, str(wheel), "-c", str(PROJECT_ROOT / "requirements.lock")], env=env)  # README
    _run([*pip, "--no-deps", "bert4keras==0.11.5"], env=env)
    work = base / "work"
    work.mkdir()
    # A user's own packages of the same names where the commands run: never imported in their
    # place (`spo serve` started gunicorn with `python -m`, which puts the current directory first).
    for name in ("app", "nlp", "training"):
        (work / name).mkdir()
        (work / name / "__init__.py").write_text(f"raise ImportError('the user\\'s own {name}')\n")
    where = _run(
        [
            str(venv / "bin" / "python"),
            "-P",
            "-c",
            "import app, nlp; print(app.__file__, nlp.__file__)",
        ],
        env=env,
        cwd=work,
    )
    assert all(Path(p).is_relative_to(venv) for p in where.stdout.decode().split())
    return venv, env, work


@pytest.mark.slow
@pytest.mark.live
@pytest.mark.timeout(1500)
def test_install_wheel_spo_extract_answers_the_readme_example(
    installed: tuple[Path, dict[str, str], Path],
) -> None:
    venv, env, work = installed
    assert EXTRACT is not None
    proc = _run(
        [str(venv / "bin" / "spo"), "extract", "-"],
        input=(EXTRACT.group(1) + "\n").encode(),
        env=env,
        cwd=work,
    )
    assert proc.stdout == (EXTRACT.group(2) + "\n").encode()


@pytest.mark.slow
@pytest.mark.live
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("nginx", [False, True], ids=["gunicorn", "nginx"])
def test_install_wheel_spo_serve_answers_the_readme_example(
    installed: tuple[Path, dict[str, str], Path], nginx: bool
) -> None:
    if nginx and NGINX is None:
        pytest.skip(
            "nginx is not installed (.ci/run installs nginx-light): spo serve --nginx skipped"
        )
    venv, env, work = installed
    assert CURL is not None
    port = free_port()
    argv = [str(venv / "bin" / "spo"), "serve"]
    argv += ["--nginx", f"127.0.0.1:{port}"] if nginx else ["--bind", f"127.0.0.1:{port}"]
    log = work / f"serve-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            env={**env, "SPO_WORKERS": "1", "PATH": f"/usr/sbin:{env.get('PATH', '')}"},
            cwd=work,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(port, process, log, timeout=300)
        answer = call(
            port,
            "POST",
            "/v1/extract",
            CURL.group(1).encode(),
            {"Content-Type": "application/json"},
        )
        assert answer.status == 200, answer.body
        assert answer.body == (CURL.group(2) + "\n").encode()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0, log.read_text()[-3000:]


BLOCK_BERT4KERAS = """
import sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "bert4keras":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
import nlp.tokenization
"""


def test_install_without_bert4keras_the_error_gives_the_readme_command(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_BERT4KERAS], capture_output=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode != 0
    last = proc.stderr.decode().strip().splitlines()[-1]
    command = "pip install --no-deps bert4keras==0.11.5"
    assert last == f"ModuleNotFoundError: bert4keras is not installed; install it with: {command}"
    assert command in README


def test_install_no_default_model_names_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no demo model is embedded, the error says what to set, not how to build it."""
    from app.core import settings as settings_module

    missing = tmp_path / "no-embedded-model"
    monkeypatch.setattr(settings_module, "DEFAULT_MODEL_DIR", missing)
    with pytest.raises(SettingsError) as info:
        Settings(model_dir=missing)
    (problem,) = [p for p in info.value.problems if p.startswith("SPO_MODEL_DIR")]
    assert all(name in problem for name in ("SPO_MODEL_DIR", "SPO_MODELS", "--model"))
    assert "make " not in problem
