"""Batch extraction of text files: ``spo extract`` (and ``flask --app app extract``).

A thin click command (``app.batch.command``) over ``run_batch`` (``app.batch.runner``), a streaming
generator pipeline: ``records`` reads inputs, ``workers`` runs the model, ``output`` writes JSON lines
with a checkpoint for ``--resume``; ``textfile`` writes the run's metrics file. Documented in
``docs/batch.md``.

It may import ``app.core`` and ``nlp`` (never the web layer: the batch command runs without a server).
"""

from __future__ import annotations

from typing import Any

from app.batch.runner import BatchError, BatchOptions, BatchSummary, run_batch

__all__ = ["BatchError", "BatchOptions", "BatchSummary", "init_app", "run_batch"]


def init_app(app: Any) -> None:
    """Register ``extract`` on ``app.cli``: ``flask --app app extract ...``."""
    from app.batch.command import extract

    app.cli.add_command(extract)
