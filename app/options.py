"""Command-line options that several ``spo`` commands share, declared once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from nlp.config import DEFAULT_PRECISION, PRECISIONS, precision_help

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def precision_option(
    default: str | None = DEFAULT_PRECISION, help_lead: str = "Model precision"
) -> Decorator:
    """``--precision``: the choices and their help come from ``nlp.config.PRECISIONS``."""
    return click.option(
        "--precision",
        type=click.Choice(list(PRECISIONS)),
        default=default,
        show_default=default is not None,
        help=f"{help_lead} ({precision_help()}).",
    )
