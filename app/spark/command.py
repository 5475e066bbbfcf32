"""``spo spark-extract``: the thin click command over ``app.spark.job.run_spark_extract``.

``pyspark`` is an optional extra: it is imported when the command runs, so ``spo --help`` and every
other command work without it, and this one says how to install it.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import click

from app.core.options import click_options
from app.core.settings import model_directory

INSTALL_HINT = "pip install 'spo-service[spark]' (in a checkout: make extra-spark)"


@click.command("spark-extract")
@click.argument("inputs", nargs=-1, required=True)
@click.argument("output")
@click.option(
    "--master",
    metavar="URL",
    help="Spark master (local[N], spark://HOST:PORT, yarn, k8s://...); default: what spark-submit "
    "set, else local[*]. A local master given here, or local[*], retries a failed task once "
    "(local[N] runs as local[N,2]).",
)
@click.option(
    "--ship-model",
    is_flag=True,
    help="Send the model to the executors with the job: a self-contained .tar.gz of the directory "
    "(SparkContext.addArchive), unpacked once per executor and sha256-checked.",
)
@click.option(
    "--python",
    "python",
    metavar="PATH",
    help="The executors' Python, with spo installed, at this path on every node.",
)
@click.option(
    "--python-env",
    metavar="ARCHIVE",
    help="A packed environment (venv-pack .tar.gz) shipped to the executors as their Python "
    "(cluster masters; see docs/spark.md).",
)
@click.option(
    "--conf",
    "confs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Extra Spark configuration (repeatable), e.g. --conf spark.task.cpus=2.",
)
@click_options("spark-extract")
def spark_extract(
    inputs: tuple[str, ...],
    output: str,
    master: str | None,
    ship_model: bool,
    python: str | None,
    python_env: str | None,
    confs: tuple[str, ...],
    model: str | None,
    precision: str | None,
    max_text_chars: int,
    input_format: str,
    output_format: str,
    text_field: str,
    id_field: str,
    force: bool,
    quiet: bool,
    partitions: int | None,
) -> None:
    """Extract from INPUTS (files, directories or globs Spark can read) into OUTPUT on Spark.

    \b
    Inputs: text lines (id = line number) or JSON lines {"id": ..., "text": ...}, as spo extract.
    OUTPUT: a directory of part files, one row per input line, in input order:
            {"id", "entities", "triples"} or {"id", "error": {"code", "message"}}.
    The model (--model) must be on storage every node sees, unless --ship-model.
    A bad record is an error row, never a failed job. See docs/spark.md.
    """
    try:
        model_dir = model_directory(model)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        from app.spark import job as spo_spark
    except ImportError as exc:
        raise click.ClickException(
            f"spark-extract needs PySpark ({exc.name} is missing): {INSTALL_HINT}"
        ) from None
    if shutil.which("java") is None and not _java_home():
        raise click.ClickException(
            "Spark needs a Java runtime (17 or 21): apt-get install openjdk-17-jre-headless"
        )
    settings: dict[str, str] = {}
    for conf in confs:
        key, sep, value = conf.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {conf!r}", param_hint="--conf")
        settings[key] = value
    options = spo_spark.SparkExtractOptions(
        inputs=inputs,
        output=output,
        model_dir=model_dir,
        input_format=input_format,
        output_format=output_format,
        text_field=text_field,
        id_field=id_field,
        partitions=partitions,
        max_text_chars=max_text_chars,
        precision=precision,
        ship_model=ship_model,
        force=force,
    )
    problems = options.problems()
    if problems:
        raise click.UsageError("; ".join(problems))
    from pyspark.sql import SparkSession

    ours = SparkSession.getActiveSession() is None
    try:
        spark = spo_spark.session(master, settings, python=python, python_env=python_env)
    except spo_spark.SparkExtractError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        summary = spo_spark.run_spark_extract(spark, options)
    except spo_spark.SparkExtractError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if ours:  # a session the caller had (a notebook, a test) stays theirs
            try:
                spark.stop()
            except Exception as exc:  # a JVM that died (out of memory): its error is the one told
                logging.getLogger(__name__).debug("stopping Spark: %s", exc)
    if not quiet:
        click.echo(summary.line(), err=True)


def _java_home() -> bool:
    home = os.environ.get("JAVA_HOME")
    return home is not None and Path(home, "bin", "java").is_file()
