"""Model commands: ``spo make-corpus``, ``spo train``, ``spo evaluate``, ``spo export``, ``spo export-onnx``,
``spo export-openvino``, ``spo quantize``, ``spo copy-vocab``.

Thin click wrappers over ``training.*``, the only command lines of those modules (imported inside each
command, so ``spo --help`` stays fast; ``training.config`` is light: it gives ``spo train`` its
defaults). The web process never imports this module.
"""

from __future__ import annotations

import fcntl
import io
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

import click

from app.batch.output import json_bytes
from app.core.options import precision_option
from nlp.config import DEMO_MODEL_DIR, DEMO_VOCAB, PRECISIONS
from nlp.decoding import LINK_RULES
from nlp.tasks import TASK_NAMES, Task
from training.config import (
    DEFAULT_NAMES,
    DEMO_BERT_CONFIG,
    MAX_DROPOUT,
    MAX_EMA,
    MAX_TOKEN_NOISE,
    TrainConfig,
    encoder_config,
)

F = TypeVar("F", bound=Callable[..., Any])


def _existing(*decls: str, directory: bool = False, **kwargs: Any) -> Callable[[F], F]:
    """A click option naming an existing file (``directory``: an existing directory)."""
    kind = click.Path(exists=True, file_okay=not directory, dir_okay=directory, path_type=Path)
    return click.option(*decls, type=kind, **kwargs)


_LINK_RULE_HELP = (
    "How a predicate links a subject and an object (model.json's link_rule; triples only): both: "
    "its head-head and tail-tail scores each above the threshold (bert4keras's GPLinker); mean: "
    "their mean above it (pick it on a tuning set with spo evaluate)."
)


def _file_problem(path: Path, force: bool) -> str | None:
    """Why a file output (``spo make-corpus OUT``, ``spo evaluate --errors``) may not be written at
    ``path`` (None: it may): something other than a regular file is there, or a file is and
    ``force`` is not set. Asked before any work, as ``spo extract -o`` asks."""
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file():
        return f"{path} exists and is not a regular file"
    return None if force else f"{path} exists (use --force to replace it)"


def _staging(path: Path) -> Path:
    """Where ``_written_whole`` writes ``path`` before the rename: ``.NAME.partial`` beside it."""
    return path.with_name(f".{path.name}.partial")


@contextmanager
def _written_whole(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` for the block to fill, renamed over ``path`` when the block
    ends and removed when it raises: ``path`` is never left half-written (an interrupted corpus
    would train a different model without a word). Made at once, so a path that cannot be written
    fails before the work, in one line. The temporary file is locked (``flock``) until the end: a
    second run writing the same ``path`` at the same time is refused, instead of both writing one
    temporary file (a lock left by a killed run goes with it; so does its file, truncated here)."""
    tmp = _staging(path)
    # The folders made here for ``path`` go again when the block fails: a failed run leaves nothing.
    made = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
    done = False
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _cannot_write(path, exc) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise click.ClickException(
                    f"{path} is being written by another run right now ({tmp.name} is locked); "
                    "wait for it to end"
                ) from None
            os.ftruncate(fd, 0)
            try:
                yield tmp
                os.replace(tmp, path)
                done = True
            finally:
                tmp.unlink(missing_ok=True)
        finally:
            os.close(fd)
    finally:
        if not done:
            for directory in made:  # deepest first; one another run filled meanwhile stays
                try:
                    directory.rmdir()
                except OSError:
                    break


def _cannot_write(path: Path, exc: OSError) -> click.ClickException:
    return click.ClickException(f"cannot write {path}: {exc.strerror or exc}")


def _conversion_failed(out: Path, exc: OSError) -> click.ClickException:
    """A converter's failure of the file system: another run made OUT meanwhile (what
    ``staged_model_dir`` checks again before the move), a full disk, an unreadable input; the
    directory OUT replaces, if any, is as it was. A path in the converter's staging folder (gone by
    now) is named as OUT."""
    if isinstance(exc, FileExistsError) and exc.errno is None:
        return click.ClickException(str(exc))
    where = Path(exc.filename) if exc.filename is not None else out
    try:
        staged = where.relative_to(out.parent).parts[0].startswith(f".{out.name}.")
    except (ValueError, IndexError):
        staged = False
    if where == out or staged:
        return _cannot_write(out, exc)
    return click.ClickException(f"{where}: {exc.strerror or exc}")


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM (kill, a container stopped) ends the command as Ctrl-C does, through every
    ``finally``: a model being written is staged beside OUT, and killed outright the staging
    folder stayed behind. Exit status 143 (128 + SIGTERM), as a shell expects."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _choice(*decls: str, choices: tuple[str, ...], **kwargs: Any) -> Callable[[F], F]:
    """A click option taking one of ``choices``, the first by default (shown in --help)."""
    return click.option(
        *decls, type=click.Choice(choices), default=choices[0], show_default=True, **kwargs
    )


@click.command("make-corpus")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--n", "count", type=click.IntRange(min=1), default=20000, show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=1, show_default=True)
@_choice(
    "--split",
    choices=("train", "heldout"),
    help="Name pool: held-out names never occur in the training pool.",
)
@click.option(
    "--hand-written",
    "hand_written",
    type=click.IntRange(0, 100),
    default=0,
    show_default=True,
    metavar="COPIES",
    help="Also write COPIES copies of the project's hand-written training sentences after the "
    "generated records (train split only; their entities are their triples' arguments, so they "
    "suit the triples task).",
)
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
def make_corpus(
    out: Path, count: int, seed: int, split: str, hand_written: int, force: bool
) -> None:
    """Write a synthetic DuIE-style corpus (JSON lines) to OUT, or - for stdout (needs the
    training extra: faker); with --hand-written, the project's hand-written training sentences
    after it.

    OUT is written whole or not at all (a temporary file beside it, renamed at the end)."""
    if hand_written and split != "train":
        raise click.BadParameter(
            "the hand-written sentences are training text: use them with --split train",
            param_hint="--hand-written",
        )
    to_stdout = str(out) == "-"
    if to_stdout and sys.stdout is None:  # started with stdout closed (`>&-`)
        raise click.BadParameter("stdout is closed: name a file", param_hint="OUT")
    problem = None if to_stdout else _file_problem(out, force)
    if problem is not None:
        raise click.BadParameter(problem, param_hint="OUT")
    try:
        from training.corpus import hand_written_records, write_corpus, write_records
    except ImportError as exc:
        raise click.ClickException(
            f"make-corpus needs the training extra ({exc.name} is missing): "
            "pip install 'spo-service[training]' (in a checkout: make extra-training)"
        ) from None
    try:  # read before the corpus is written: a broken install fails at once, OUT untouched
        extra = hand_written_records() * hand_written if hand_written else []
    except (OSError, ValueError) as exc:
        raise click.ClickException(
            f"cannot read the hand-written training sentences: {exc}"
        ) from None

    if to_stdout:
        stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
        try:
            write_records(stdout, count, seed, split, extra)
            stdout.flush()
        except BrokenPipeError:  # the reader went away (| head): stop quietly, as spo extract does
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None
        finally:
            stdout.detach()
        click.echo(f"-: {_corpus_summary(count, seed, split, len(extra))}", err=True)
        return
    with _sigterm_unwinds(), _written_whole(out) as tmp:  # killed: no .partial file left behind
        try:
            write_corpus(tmp, count, seed, split, extra)
        except OSError as exc:
            raise _cannot_write(out, exc) from None
    click.echo(f"{out}: {_corpus_summary(count, seed, split, len(extra))}")


def _corpus_summary(count: int, seed: int, split: str, hand_written: int) -> str:
    """What ``spo make-corpus`` wrote: ``96000 records (seed 1, train names)``, and the
    hand-written lines after them when there are any."""
    summary = f"{count} records (seed {seed}, {split} names)"
    return summary + (f" and {hand_written} hand-written" if hand_written else "")


def _finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number")
    return value


# Steps a run may ask for (a number of 400 digits reached TensorFlow as a tensor it cannot hold).
MAX_STEPS = 10_000_000


@click.command("train")
@click.argument("train_path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--task",
    type=click.Choice(TASK_NAMES),
    default=TrainConfig.task,
    show_default=True,
    help="triples: GPLinker on the records' triples; entities: typed GlobalPointer NER on their "
    "entity mentions.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Model directory to write [default: models/demo, or models/ner with --task entities, "
    "under the working directory].",
)
@click.option(
    "--epochs", type=click.IntRange(1, 10_000), default=TrainConfig.epochs, show_default=True
)
@click.option(
    "--batch-size", type=click.IntRange(1, 4096), default=TrainConfig.batch_size, show_default=True
)
@click.option("--lr", type=float, default=TrainConfig.learning_rate, show_default=True)
@click.option(
    "--warmup",
    type=click.IntRange(0, MAX_STEPS),
    default=TrainConfig.warmup_steps,
    show_default=True,
    help="Learning-rate warm-up steps.",
)
@click.option(
    "--max-steps",
    type=click.IntRange(1, MAX_STEPS),
    default=None,
    help="Train exactly this many steps (overrides --epochs; reproducible on any machine).",
)
@click.option(
    "--dropout",
    type=click.FloatRange(0.0, MAX_DROPOUT),
    default=None,
    help="Encoder dropout (0.1).",
)
@click.option(
    "--token-noise",
    type=click.FloatRange(0.0, MAX_TOKEN_NOISE),
    default=TrainConfig.token_noise,
    show_default=True,
    help="Share of input tokens replaced in each batch by tokens drawn from the corpus (labels "
    "unchanged): noise against leaning on exact wording.",
)
@click.option(
    "--ema",
    type=click.FloatRange(0.0, MAX_EMA),
    default=TrainConfig.ema,
    show_default=True,
    help="Decay of an exponential moving average of the weights, updated after every step and "
    "exported instead of the last step's (0.999: about the last 1,000 steps; 0 turns it off).",
)
@click.option(
    "--xla/--no-xla",
    default=TrainConfig.xla,
    show_default=True,
    help="Compile each training step with XLA: about a third faster a step on 2 CPU cores for "
    "the demo model, after a compile of about 20 s for each of its 8 batch shapes (lengths in "
    "steps of 16, every batch full).",
)
@click.option(
    "--max-minutes",
    type=float,
    default=TrainConfig.max_minutes,
    show_default=True,
    help="Safety net: stop training after this long (the export still runs).",
)
@click.option(
    "--hidden-size",
    type=click.IntRange(4, 1024),
    default=DEMO_BERT_CONFIG["hidden_size"],
    show_default=True,
    help="Encoder width (a multiple of its 4 attention heads; feed-forward 4x as wide).",
)
@click.option(
    "--threshold",
    type=float,
    default=TrainConfig.threshold,
    show_default=True,
    help="Score threshold written to model.json: the decoder keeps what scores above it (below 0 "
    "trades precision for recall; pick it on a tuning set with spo evaluate).",
)
@_choice("--link-rule", choices=LINK_RULES, help=_LINK_RULE_HELP)
@click.option(
    "--serve-length",
    type=click.IntRange(3, TrainConfig.max_length),
    default=None,
    help=f"max_length written to model.json, in tokens ([CLS] and [SEP] included): the longest "
    f"input the server gives the model; longer texts are read in overlapping windows of it "
    f"[default: the {TrainConfig.max_length} trained with]. A model reads best the positions its "
    "corpus filled: pick it with spo evaluate on long texts.",
)
@click.option(
    "--seed", type=click.IntRange(0, 2**32 - 1), default=TrainConfig.seed, show_default=True
)
def train_command(
    train_path: Path,
    task: str,
    out: Path | None,
    epochs: int,
    batch_size: int,
    lr: float,
    warmup: int,
    max_steps: int | None,
    dropout: float | None,
    token_noise: float,
    ema: float,
    xla: bool,
    max_minutes: float,
    hidden_size: int,
    threshold: float,
    link_rule: str,
    serve_length: int | None,
    seed: int,
) -> None:
    """Train a GPLinker or NER model (random init, demo encoder) on TRAIN_PATH; export it to --out.

    TRAIN_PATH: JSON lines as spo make-corpus writes them ({"text", "triples", "entities"}), checked
    before training starts; a bad line is named and nothing is trained.
    """
    from training.evaluate import DataError
    from training.train import TrainingError, train

    if task != Task.TRIPLES and link_rule != LINK_RULES[0]:
        raise click.BadParameter(
            f"a link rule is for triples models, not an {task} model", param_hint="--link-rule"
        )

    try:
        bert_config = encoder_config(hidden_size)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--hidden-size") from None
    if out is None:
        out = Path("models", DEFAULT_NAMES[task])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        config = TrainConfig(
            train_path=train_path,
            out_dir=out,
            epochs=epochs,
            batch_size=batch_size,
            learning_rate=lr,
            warmup_steps=warmup,
            max_steps=max_steps,
            dropout=dropout,
            token_noise=token_noise,
            ema=ema,
            xla=xla,
            max_minutes=max_minutes,
            seed=seed,
            task=task,
            threshold=threshold,
            link_rule=link_rule,
            serve_length=serve_length,
            bert_config=bert_config,
        )
    except ValueError as exc:  # NaN and other values click's ranges let through
        raise click.UsageError(_as_flags(str(exc))) from None
    try:
        with _sigterm_unwinds():
            result = train(config)
    except (DataError, FileExistsError, TrainingError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # a full disk at the end: the directory at --out is as it was
        raise _conversion_failed(out, exc) from None
    click.echo(f"model written to {result}")


# TrainConfig's fields as spo train's flags name them, for its problems (``TrainConfig.problems``).
_TRAIN_FLAGS = {
    "learning_rate": "--lr",
    "warmup_steps": "--warmup",
    **{
        name: "--" + name.replace("_", "-")
        for name in (
            "epochs", "batch_size", "max_steps", "dropout", "token_noise", "ema", "max_minutes",
            "serve_length",
        )
    },
}  # fmt: skip


def _as_flags(problems: str) -> str:
    """``TrainConfig``'s problems with each leading field named as its flag.

    >>> _as_flags("learning_rate must be a positive finite number, got 0.0; ema must be 0 to 0.9999")
    '--lr must be a positive finite number, got 0.0; --ema must be 0 to 0.9999'
    """
    out = []
    for problem in problems.split("; "):
        name, _, rest = problem.partition(" ")
        out.append(f"{_TRAIN_FLAGS.get(name, name)} {rest}" if rest else problem)
    return "; ".join(out)


@click.command("evaluate")
@click.argument("data_path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--model",
    "model_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=DEMO_MODEL_DIR,
    show_default=True,
)
@click.option(
    "--errors",
    "errors_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the records the model got wrong (JSON lines) here.",
)
@click.option("--force", is_flag=True, help="Replace the --errors file if it exists.")
@precision_option(default=None, help_lead="Run the model in this precision")
@_existing(
    "--baseline",
    "baseline_dir",
    directory=True,
    help="Also score this model (e.g. the fp32 parent of an int8 model) and count the texts whose "
    "triples are identical in both.",
)
@click.option(
    "--baseline-precision",
    type=click.Choice(list(PRECISIONS)),
    default=None,
    help="Precision of --baseline (default: its own).",
)
@_choice(
    "--format",
    "output_format",
    choices=("json", "text"),
    help="json: one line, the overall scores with by_predicate (or by_type) and by_pattern; "
    "text: the same as aligned tables.",
)
def evaluate_command(
    data_path: Path,
    model_dir: Path,
    errors_path: Path | None,
    force: bool,
    precision: str | None,
    baseline_dir: Path | None,
    baseline_precision: str | None,
    output_format: str,
) -> None:
    """Micro precision / recall / F1 on DATA_PATH: exact (subject, predicate, object) triples for a
    triples model, exact entities (span and type) for an entities model; overall, per predicate
    (per type for an entities model) and, when records carry "patterns": [...], per pattern (a
    pattern counts the triples of the records tagged with it).

    With --baseline: both models' overall scores, the F1 difference and the share of texts whose
    results are identical (how an int8 model is checked against its fp32 parent).
    """
    from nlp.errors import ModelLoadError
    from training.evaluate import DataError, MismatchError, compare, evaluate

    if baseline_dir is not None and errors_path is not None:
        raise click.UsageError("--errors is for one model; leave out --baseline")
    if baseline_dir is not None and output_format != "json":
        raise click.UsageError("--format text is for one model; leave out --baseline")
    if errors_path is not None:
        if errors_path.exists() and errors_path.samefile(data_path):
            raise click.BadParameter(
                f"{errors_path} is DATA_PATH: writing the errors there would replace the data",
                param_hint="--errors",
            )
        staging = _staging(errors_path)
        if staging.exists() and staging.samefile(data_path):
            raise click.BadParameter(
                f"DATA_PATH is {staging.name}, where --errors {errors_path} is written before it "
                "is renamed: the data would be emptied; rename it",
                param_hint="--errors",
            )
        for directory in (model_dir, baseline_dir):  # --force would replace one of its files
            if directory is not None and errors_path.resolve().is_relative_to(directory.resolve()):
                raise click.BadParameter(
                    f"{errors_path} is inside the model directory {directory}: write the errors "
                    "elsewhere",
                    param_hint="--errors",
                )
        problem = _file_problem(errors_path, force)
        if problem is not None:
            raise click.BadParameter(problem, param_hint="--errors")
    # The errors file is made before the evaluation, so a path that cannot be written fails first.
    written = _written_whole(errors_path) if errors_path is not None else nullcontext(None)
    # Killed (SIGTERM), the errors file's staging goes as on Ctrl-C.
    with _sigterm_unwinds():
        try:
            if baseline_dir is not None:
                comparison = compare(
                    model_dir,
                    baseline_dir,
                    data_path,
                    precision=precision,
                    baseline_precision=baseline_precision,
                )
                click.echo(json.dumps(comparison.to_dict(), ensure_ascii=False))
                return
            with written as tmp:
                scores, errors = evaluate(model_dir, data_path, precision=precision)
                if tmp is not None and errors_path is not None:
                    try:
                        with tmp.open("wb") as fh:
                            fh.writelines(json_bytes(e) + b"\n" for e in errors)
                    except OSError as exc:
                        raise _cannot_write(errors_path, exc) from None
        except (ModelLoadError, DataError, MismatchError) as exc:
            raise click.ClickException(str(exc)) from exc
    if output_format == "text":
        click.echo(scores.to_text(f"{data_path} on {model_dir}"))
    else:
        click.echo(json.dumps(scores.to_dict(), ensure_ascii=False))


@click.command("export")
@_existing(
    "--bert-config",
    "bert_config_path",
    required=True,
    help="bert4keras/BERT config JSON (bert_config.json).",
)
@click.option(
    "--weights",
    "weights_path",
    type=click.Path(path_type=Path),
    required=True,
    help="What model.save_weights wrote: .h5/.weights.h5 file or TF checkpoint prefix.",
)
@_existing(
    "--schema",
    "schema_path",
    required=True,
    help="DuIE all_50_schemas JSON lines, a JSON list of the same objects, or a JSON "
    "list of entity type names (NER).",
)
@_existing("--vocab", "vocab_path", default=DEMO_VOCAB, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--head-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--max-length", type=click.IntRange(3, 8192), default=256, show_default=True)
@click.option("--name", default="custom", show_default=True)
@click.option("--model-version", "version", default="1", show_default=True)
@click.option(
    "--threshold",
    type=float,
    default=0.0,
    show_default=True,
    callback=_finite,
    help="Score threshold written to model.json: the decoder keeps what scores above it.",
)
@_choice("--link-rule", choices=LINK_RULES, help=_LINK_RULE_HELP)
@click.option("--cased", is_flag=True, help="The vocab is cased (no lower-casing).")
@_choice("--mode", choices=("graph", "tf2"))
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def export_command(out_dir: Path, cased: bool, force: bool, **params: Any) -> None:
    """Turn a bert4keras GPLinker / GlobalPointer NER model into a model directory."""
    from training.export import export_user_model

    try:
        with _sigterm_unwinds():
            result = export_user_model(
                out_dir=out_dir, do_lower_case=not cased, force=force, **params
            )
    except ValueError as exc:  # --out, the schema, config or weights, or an option of another task
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # a full disk: the directory at --out is as it was
        raise _conversion_failed(out_dir, exc) from None
    click.echo(f"model written to {result}")


@click.command("export-onnx")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@_choice(
    "--precision",
    choices=("fp32", "int8"),
    help="int8: ONNX Runtime dynamic quantization (int8 weights) of the converted model.",
)
@click.option("--opset", type=click.IntRange(min=13), default=17, show_default=True)
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
def export_onnx_command(
    model_dir: Path, out: Path, precision: str, opset: int, force: bool
) -> None:
    """Convert MODEL_DIR's SavedModel into OUT, a model directory for the opt-in onnx engine.

    Serve OUT like any model directory (SPO_MODEL_DIR=OUT): its model.json selects ONNX Runtime.
    Needs the optional extra: pip install 'spo-service[onnx]'.
    """
    from nlp.errors import ModelLoadError
    from training.onnx_export import OnnxExportError, export_onnx

    try:
        with _sigterm_unwinds():
            result = export_onnx(model_dir, out, precision=precision, opset=opset, force=force)
    except (OnnxExportError, ModelLoadError) as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise _conversion_failed(out, exc) from None
    click.echo(f"onnx model ({precision}) written to {result}")


@click.command("export-openvino")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@_choice(
    "--precision",
    choices=("fp32", "int8"),
    help="int8: NNCF post-training quantization, calibrated on real sentences (--calibration).",
)
@click.option(
    "--calibration",
    "calibration",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="int8 only: your own sentences, JSON lines with a 'text' field or plain text, one a "
    "line (default: 300 sentences of the synthetic generator, which needs the training extra).",
)
@click.option(
    "--samples",
    type=click.IntRange(min=1),
    default=300,
    show_default=True,
    help="int8 only: calibrate on at most this many texts.",
)
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
def export_openvino_command(
    model_dir: Path,
    out: Path,
    precision: str,
    calibration: Path | None,
    samples: int,
    force: bool,
) -> None:
    """Convert MODEL_DIR's SavedModel into OUT, a model directory for the opt-in openvino engine.

    Serve OUT like any model directory (SPO_MODEL_DIR=OUT): its model.json selects OpenVINO.
    Needs the optional extra: pip install 'spo-service[openvino]'.
    """
    from training.openvino_export import OpenVinoExportError, export_openvino

    if calibration is not None and precision != "int8":
        raise click.UsageError("--calibration is for --precision int8 only")
    try:
        with _sigterm_unwinds():
            result = export_openvino(
                model_dir, out, precision=precision, calibration=calibration, samples=samples,
                force=force,
            )  # fmt: skip
    except OpenVinoExportError as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise _conversion_failed(out, exc) from None
    click.echo(f"openvino model ({precision}) written to {result}")


@click.command("quantize")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option(
    "--calibration",
    "calibration_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Your own sentences: JSON lines with a 'text' field, or plain text, one a line "
    "(default: 200 sentences of the demo corpus).",
)
@click.option(
    "--max-texts",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Calibrate on at most the first this many texts of --calibration.",
)
@click.option("--force", is_flag=True, help="Replace OUT_DIR if it exists.")
def quantize_command(
    model_dir: Path, out_dir: Path, calibration_path: Path | None, max_texts: int, force: bool
) -> None:
    """Write an int8 copy of the fp32 model in MODEL_DIR to OUT_DIR (served with precision int8).

    Static post-training quantization with Intel Neural Compressor (the optional extra:
    pip install 'spo-service[quantize]'), calibrated on real sentences. Check the result
    with `spo evaluate DATA --model OUT_DIR --baseline MODEL_DIR`.
    """
    from training.quantize import QuantizeError, quantize, read_calibration

    given = click.get_current_context().get_parameter_source("max_texts")
    if calibration_path is None and given is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError(
            "--max-texts is for --calibration (without it: 200 sentences of the demo corpus)"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        calibration = (
            read_calibration(calibration_path, max_texts=max_texts)
            if calibration_path is not None
            else None
        )
        with _sigterm_unwinds():
            result = quantize(model_dir, out_dir, calibration=calibration, force=force)
    except QuantizeError as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise _conversion_failed(out_dir, exc) from None
    click.echo(f"int8 model written to {result}")


@click.command("copy-vocab")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
def copy_vocab_command(model_dir: Path) -> None:
    """Make MODEL_DIR self-contained: copy the vocab it names outside itself (the old layout,
    vocab/vocab.txt relative to the project root) in as vocab.txt, and point model.json at it."""
    from nlp.errors import SpoError
    from nlp.manifest import copy_vocab_in

    try:
        old = copy_vocab_in(model_dir)
    except SpoError as exc:
        raise click.ClickException(exc.message) from exc
    except OSError as exc:  # a read-only mount, no permission: model.json was not touched
        raise click.ClickException(
            f"cannot write into {model_dir}: {exc.strerror or exc}; model.json is unchanged"
        ) from None
    if old is None:
        click.echo(f"{model_dir} holds its vocab already; nothing to do")
    else:
        click.echo(f"{model_dir}: copied {old} in as vocab.txt; model.json names it")


COMMANDS = (
    make_corpus,
    train_command,
    evaluate_command,
    export_command,
    export_onnx_command,
    export_openvino_command,
    quantize_command,
    copy_vocab_command,
)
