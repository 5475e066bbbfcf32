"""The ``spo`` management command: a click group over thin commands, each owned by its module."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spo-service", prog_name="spo")
def main() -> None:
    """spo-service: extract entities and (subject, predicate, object) triples from Chinese text."""


# Each command lives with the code it drives; register it here (one line per module).
from app.server import serve  # noqa: E402

main.add_command(serve)
from app.modelcli import COMMANDS as _model_commands  # noqa: E402

for _command in _model_commands:
    main.add_command(_command)
from app.batch.command import extract  # noqa: E402

main.add_command(extract)
from app.sparkcli import spark_extract  # noqa: E402

main.add_command(spark_extract)
