"""The ``spo`` management command: a click group over thin commands, each owned by its module
(``app.serving.server``, ``app.batch.command``, ``app.spark.command``; the model commands, training
and export, in ``model``).

The top of the stack: it may import every part of ``app``, ``nlp`` and, lazily in the model commands,
``training``.
"""

from __future__ import annotations

import logging

import click

from app.core.logs import configure_logging
from app.core.settings import LogSettings, SettingsError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spo-service", prog_name="spo")
@click.pass_context
def main(ctx: click.Context) -> None:
    """spo-service: extract entities and (subject, predicate, object) triples from Chinese text.

    Every command logs to stderr as SPO_LOG_FORMAT (text, or json lines) and SPO_LOG_LEVEL say.
    """
    if ctx.invoked_subcommand == "serve":
        return  # serve checks every setting at once, and gunicorn sets up its own logging
    try:
        log_settings = LogSettings.from_env()
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None
    # A process that set up logging already (a program embedding the command, a test runner) keeps it.
    if not logging.getLogger().handlers:
        configure_logging(log_settings)


# Each command lives with the code it drives; register it here (one line per module).
from app.serving.server import reload, serve  # noqa: E402

main.add_command(serve)
main.add_command(reload)
from app.cli.model import COMMANDS as _model_commands  # noqa: E402

for _command in _model_commands:
    main.add_command(_command)
from app.batch.command import extract  # noqa: E402

main.add_command(extract)
from app.spark.command import spark_extract  # noqa: E402

main.add_command(spark_extract)
