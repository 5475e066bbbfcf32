"""Command-line options that several ``spo`` commands share, declared once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from nlp.config import DEFAULT_PRECISION, PRECISIONS, precision_help

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def precision_option() -> Decorator:
    """``--precision``: the choices and their help come from ``nlp.config.PRECISIONS``."""
    return click.option(
        "--precision",
        type=click.Choice(list(PRECISIONS)),
        default=DEFAULT_PRECISION,
        show_default=True,
        help=f"Model precision ({precision_help()}).",
    )
