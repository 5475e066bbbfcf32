"""``spo extract``: the thin click command over ``app.batch.runner.run_batch``."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import click

from app.batch.output import OutputError, checkpoint_path
from app.batch.records import InputError, is_same_file
from app.batch.runner import BatchError, BatchOptions, run_batch
from app.batch.textfile import textfile_problem
from app.batch.workers import WorkerError
from app.core.options import click_options
from app.core.settings import model_directory
from nlp.errors import SpoError


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread, unwinding like ``KeyboardInterrupt`` (a
    ``BaseException``, so that no ``except Exception`` on the way swallows it)."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def _how_to_go_on(output: str, force: bool) -> str:
    """What a stopped run leaves, and what to run next: ``--resume`` exactly when there is a
    checkpoint to continue, which is what ``--resume`` asks for (a run stopped while its model
    loaded has written nothing: the output is as it was, an old complete one included)."""
    if output == "-":
        return "the output so far went to stdout (use -o FILE to be able to --resume)"
    if not checkpoint_path(Path(output)).exists():
        return f"nothing was written: {output} is as it was; run the same command again"
    return "the output so far ends at the last checkpoint: " + (
        "run the same command with --resume instead of --force to continue"
        if force
        else "add --resume to the same command to continue"
    )


@click.command("extract")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "-o",
    "--output",
    default="-",
    show_default=True,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="JSON lines file (one run at a time writes it; an existing one needs --force or "
    "--resume), or - for stdout.",
)
@click.option("--strict", is_flag=True, help="Exit with status 1 if any record is an error.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run into the same output.")
@click_options("extract")
@click.option(
    "--metrics-file",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write the run's records, errors, texts/s... here at the end, in Prometheus' textfile "
    "format (e.g. a *.prom file in node exporter's textfile directory).",
)
def extract(
    inputs: tuple[str, ...],
    output: str,
    strict: bool,
    resume: bool,
    model: str | None,
    precision: str | None,
    short_call_threads: bool,
    extra_rewrites: tuple[str, ...],
    max_text_chars: int,
    input_format: str,
    text_field: str,
    id_field: str,
    force: bool,
    quiet: bool,
    batch_workers: int,
    recycle_after: int,
    max_rss_mb: int,
    shard: tuple[int, int],
    window: int,
    record_timeout: float,
    metrics_file: Path | None,
) -> None:
    """Extract entities and triples from INPUT files (- for stdin) into JSON lines.

    \b
    Inputs: .txt, one text per line, id = line number (1-based);
            .jsonl, one {"id": ..., "text": ...} object per line (id = line number if absent;
            a string, number, boolean or null). Gzip (.gz) is read transparently.
            A pipe (<(zcat a.gz), a FIFO) is read once, as stdin is.
            With several inputs, ids are "INPUT:ID".
    Output: one line per input line, in input order:
            {"id", "entities", "triples"} or {"id", "error": {"code", "message"}}.
    A bad record never stops the run. Killed? Run the same command with --resume.
    """
    try:
        directory = model_directory(model)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if metrics_file is not None:
        named = [i for i in inputs if i != "-"] + ([output] if output != "-" else [])
        for path in named:  # the output need not exist yet: compared by name too
            if (
                is_same_file(path, str(metrics_file))
                or Path(path).resolve() == metrics_file.resolve()
            ):
                raise click.BadParameter(
                    f"{metrics_file} is {'the output' if path == output else 'an input'}: the "
                    "metrics would replace it",
                    param_hint="--metrics-file",
                )
        # Asked now, not after the run: a directory that cannot be written (or made), a device.
        if problem := textfile_problem(metrics_file):
            raise click.BadParameter(problem, param_hint="--metrics-file")
    options = BatchOptions(
        inputs=inputs,
        output=output,
        model_dir=directory,
        input_format=input_format,
        text_field=text_field,
        id_field=id_field,
        workers=batch_workers,
        recycle_after=recycle_after,
        max_rss_mb=max_rss_mb,
        shard=shard,
        resume=resume,
        force=force,
        window=window,
        max_text_chars=max_text_chars,
        precision=precision,
        short_call_threads=short_call_threads,
        extra_rewrites=extra_rewrites,
        record_timeout=record_timeout,
    )
    # SIGTERM (kill, a container stopped or evicted) ends the run as Ctrl-C does: the workers
    # stopped, the output whole up to its last checkpoint, and a line saying how to go on.
    # (Python sets signal handlers from the main thread only; a command run elsewhere keeps its own.)
    # A stream the command was started without (cron's closed stdin, `>&-`) is None: refused only
    # where the run would use it.
    if sys.stdin is None and "-" in inputs:
        raise click.UsageError("stdin is closed: there is nothing to read as - (name a file)")
    if sys.stdout is None and output == "-":
        raise click.UsageError("stdout is closed: name an output file with -o")
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main else None
    try:
        summary = run_batch(
            options,
            stdin=sys.stdin.buffer if sys.stdin is not None else None,
            stdout=sys.stdout.buffer if sys.stdout is not None else None,
            progress=not quiet and sys.stderr is not None and sys.stderr.isatty(),
        )
    except BatchError as exc:
        raise click.UsageError(str(exc)) from None
    except (OutputError, InputError, WorkerError) as exc:
        raise click.ClickException(str(exc)) from None
    except SpoError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from None
    except (KeyboardInterrupt, Terminated) as exc:  # exit as a shell expects: 128 + the signal
        stopped = isinstance(exc, Terminated)
        click.echo(
            f"spo extract: {'terminated (SIGTERM)' if stopped else 'interrupted'}; "
            + _how_to_go_on(output, force),
            err=True,
        )
        raise SystemExit(128 + (signal.SIGTERM if stopped else signal.SIGINT)) from None
    except BrokenPipeError:  # the reader of stdout went away (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    if not quiet:
        click.echo(summary.line(), err=True)
    if metrics_file is not None:
        from app.batch.textfile import write_batch_textfile

        try:
            write_batch_textfile(metrics_file, summary)
        except OSError as exc:
            raise click.ClickException(
                f"cannot write --metrics-file {metrics_file}: {exc}"
            ) from None
    if strict and summary.total_errors:
        raise click.ClickException(f"{summary.total_errors} error records (--strict)")
