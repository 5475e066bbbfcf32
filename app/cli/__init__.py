"""The ``spo`` management command: a click group over thin commands, each owned by its module
(``app.serving.server``, ``app.batch.command``, ``app.spark.command``; the model commands, training
and export, in ``model``).

The top of the stack: it may import every part of ``app``, ``nlp`` and, lazily in the model commands,
``training``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from typing import Any

import click

from app.core.logs import configure_logging, one_line
from app.core.settings import LogSettings, SettingsError


def shown(message: str, given: Iterable[str]) -> str:
    r"""``message`` as an error line prints it: the control characters of what the user gave (a path
    with a line break or an escape sequence in it) escaped, the message's own line breaks kept.

    ``given`` is what the user typed: each argument, and each ``/``-separated part of one, that holds
    a control character is escaped wherever the message quotes it (so are the paths made from it, and
    its parent ``out\n`` of ``out\n/x.jsonl``); other control characters but a line break anywhere.

    >>> print(shown("cannot write out\n/x.jsonl: out\n is a file\n(use -o -)", ["-o", "out\n/x.jsonl"]))
    cannot write out\n/x.jsonl: out\n is a file
    (use -o -)
    >>> print(shown("no model\x1b[2J here\r", []))
    no model\x1b[2J here\r
    """
    pieces = {piece for text in given for piece in (text, *text.split("/"))}
    risky = sorted((p for p in pieces if one_line(p) != p), key=len, reverse=True)
    if risky:
        message = re.sub("|".join(map(re.escape, risky)), lambda m: one_line(m[0]), message)
    return "\n".join(one_line(line) for line in message.split("\n"))


class _Group(click.Group):
    """The ``spo`` group: an error it prints quotes a path or value the user gave on one line, escaped
    (``shown``), whichever command or module raised it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["spo.given"] = [*args, *(v for k, v in os.environ.items() if k.startswith("SPO_"))]
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            # click types ``message`` Final; it is rewritten once, here, before click shows it.
            setattr(exc, "message", shown(exc.message, ctx.meta.get("spo.given", ())))  # noqa: B010
            raise


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
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
