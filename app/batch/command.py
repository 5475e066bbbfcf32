"""``spo extract``: the thin click command over ``app.batch.runner.run_batch``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from app.batch.output import OutputError
from app.batch.records import InputError
from app.batch.runner import BatchError, BatchOptions, run_batch
from app.batch.workers import WorkerError
from app.options import precision_option
from app.settings import Settings, SettingsError
from nlp.config import DEFAULT_MAX_TEXT_CHARS
from nlp.errors import SpoError


def _shard(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int]:
    if value is None:
        return (1, 1)
    try:
        k, n = (int(part) for part in value.split("/"))
    except ValueError:
        raise click.BadParameter(f"expected K/N (e.g. 2/8), got {value!r}") from None
    if not 1 <= k <= n:
        raise click.BadParameter(f"expected 1 <= K <= N, got {value!r}")
    return (k, n)


def _model_directory(ref: str | None) -> Path:
    """The directory of ``--model NAME|DIR``, as the service resolves names (``SPO_MODELS``,
    ``SPO_MODEL_DIR``); ``None`` is the service's default model."""
    try:
        table = Settings.from_env(only=("model_dir", "models"))
    except SettingsError as exc:
        # A directory given outright needs no model table (nor a valid one).
        if ref is not None and Path(ref).expanduser().is_dir():
            return Path(ref).expanduser().resolve()
        raise click.UsageError(str(exc)) from None
    try:
        return table.resolve_model(ref)[1]
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@click.command("extract")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "-o",
    "--output",
    default="-",
    show_default=True,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="JSON lines file, or - for stdout.",
)
@click.option(
    "--model",
    "model_ref",
    metavar="NAME|DIR",
    default=None,
    help="A model name of SPO_MODELS (the names the service uses), or a model directory. "
    "Default: the service's default model (the first of SPO_MODELS, else SPO_MODEL_DIR, else "
    "models/demo).",
)
@click.option(
    "--model-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    hidden=True,
    help="Older spelling of --model DIR.",
)
@click.option(
    "--format",
    "input_format",
    type=click.Choice(["auto", "txt", "jsonl"]),
    default="auto",
    show_default=True,
    help="Input format; auto: from the suffix (.txt, .jsonl; .gz looked through), stdin is txt.",
)
@click.option(
    "--text-field", default="text", show_default=True, help="JSONL field holding the text."
)
@click.option("--id-field", default="id", show_default=True, help="JSONL field holding the id.")
@click.option(
    "--workers",
    type=click.IntRange(0),
    default=1,
    show_default=True,
    help="Worker processes, each with its own model and cores/N TensorFlow threads; 0 runs the "
    "model in this process.",
)
@click.option(
    "--recycle-after",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    metavar="TEXTS",
    help="Replace a worker after this many texts (0: never).",
)
@click.option(
    "--max-worker-rss",
    "max_rss_mb",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    metavar="MIB",
    help="Replace a worker whose RSS is over this (0: no limit).",
)
@click.option(
    "--shard",
    callback=_shard,
    metavar="K/N",
    help="Process only records K, K+N, K+2N... (1-based; over all inputs together).",
)
@click.option("--resume", is_flag=True, help="Continue an interrupted run into the same output.")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@click.option("--strict", is_flag=True, help="Exit with status 1 if any record is an error.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
@click.option(
    "--window",
    type=click.IntRange(1),
    default=2048,
    show_default=True,
    metavar="RECORDS",
    help="Records sorted by length together (bounds memory).",
)
@click.option(
    "--max-text-chars",
    type=click.IntRange(1),
    default=DEFAULT_MAX_TEXT_CHARS,
    show_default=True,
    help="Longer texts get a text_too_long error record.",
)
@click.option(
    "--record-timeout",
    type=click.FloatRange(0, 86_400),
    default=0,
    show_default=True,
    metavar="SECONDS",
    help="Most model time one record may take; a record over it becomes a deadline_exceeded "
    "error record (0: no limit).",
)
@precision_option(
    default=None,
    help_lead="Run the model in this precision (default: the model's own, fp32 or int8)",
)
@click.option(
    "--metrics-file",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write the run's records, errors, texts/s... here at the end, in Prometheus' textfile "
    "format (e.g. a *.prom file in node exporter's textfile directory).",
)
def extract(
    inputs: tuple[str, ...],
    output: str,
    model_ref: str | None,
    model_dir: Path | None,
    input_format: str,
    text_field: str,
    id_field: str,
    workers: int,
    recycle_after: int,
    max_rss_mb: int,
    shard: tuple[int, int],
    resume: bool,
    force: bool,
    strict: bool,
    quiet: bool,
    window: int,
    max_text_chars: int,
    record_timeout: float,
    precision: str | None,
    metrics_file: Path | None,
) -> None:
    """Extract entities and triples from INPUT files (- for stdin) into JSON lines.

    \b
    Inputs: .txt, one text per line, id = line number (1-based);
            .jsonl, one {"id": ..., "text": ...} object per line (id = line number if absent).
            Gzip (.gz) is read transparently. With several inputs, ids are "INPUT:ID".
    Output: one line per input line, in input order:
            {"id", "entities", "triples"} or {"id", "error": {"code", "message"}}.
    A bad record never stops the run. Killed? Run the same command with --resume.
    """
    if model_ref is not None and model_dir is not None:
        raise click.UsageError("give --model or --model-dir, not both")
    directory = _model_directory(model_ref if model_dir is None else str(model_dir))
    options = BatchOptions(
        inputs=inputs,
        output=output,
        model_dir=directory,
        input_format=input_format,
        text_field=text_field,
        id_field=id_field,
        workers=workers,
        recycle_after=recycle_after,
        max_rss_mb=max_rss_mb,
        shard=shard,
        resume=resume,
        force=force,
        window=window,
        max_text_chars=max_text_chars,
        precision=precision,
        record_timeout=record_timeout,
    )
    try:
        summary = run_batch(
            options,
            stdin=sys.stdin.buffer,
            stdout=sys.stdout.buffer,
            progress=not quiet and sys.stderr.isatty(),
        )
    except BatchError as exc:
        raise click.UsageError(str(exc)) from None
    except (OutputError, InputError, WorkerError) as exc:
        raise click.ClickException(str(exc)) from None
    except SpoError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from None
    except BrokenPipeError:  # the reader of stdout went away (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    if not quiet:
        click.echo(summary.line(), err=True)
    if metrics_file is not None:
        from app.metrics import write_batch_textfile

        try:
            write_batch_textfile(metrics_file, summary)
        except OSError as exc:
            raise click.ClickException(
                f"cannot write --metrics-file {metrics_file}: {exc}"
            ) from None
    if strict and summary.total_errors:
        raise click.ClickException(f"{summary.total_errors} error records (--strict)")
