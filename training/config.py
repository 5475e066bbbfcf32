"""What a training run can be told, with the one set of defaults (``spo train`` shows and uses them).

Light on purpose (no TensorFlow, no bert4keras): ``app/cli/model.py`` imports it to build
``spo train --help``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nlp.config import DEMO_VOCAB
from nlp.decoding import LINK_RULES
from nlp.tasks import TASK_NAMES, Task

# 6-layer RoBERTa-style encoder sized for 2 CPU cores and the 25 MB cap (embeddings dominate).
DEMO_BERT_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "intermediate_size": 512,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 128,
    "type_vocab_size": 2,
}


def encoder_config(hidden_size: int) -> dict[str, Any]:
    """The demo encoder at another width: the feed-forward layer 4x as wide, the 4 heads kept.

    >>> encoder_config(160)["intermediate_size"]
    640
    >>> encoder_config(130)
    Traceback (most recent call last):
    ...
    ValueError: hidden size 130 is not a multiple of the 4 attention heads
    """
    heads = DEMO_BERT_CONFIG["num_attention_heads"]
    if hidden_size < heads or hidden_size % heads:
        raise ValueError(
            f"hidden size {hidden_size} is not a multiple of the {heads} attention heads"
        )
    return {**DEMO_BERT_CONFIG, "hidden_size": hidden_size, "intermediate_size": 4 * hidden_size}


# The most of a batch's input tokens ``--token-noise`` may replace (``spo train`` and ``train``).
MAX_TOKEN_NOISE = 0.5


# The largest ``--ema`` decay: 0.9999 averages over about 10,000 steps, longer than any run here.
MAX_EMA = 0.9999


# The most encoder dropout ``--dropout`` takes (Keras refuses 1; above this nothing is learnt).
MAX_DROPOUT = 0.9


# The model name (and ``spo train``'s output folder under models/) of each task, unless given.
DEFAULT_NAMES: dict[str, str] = {Task.TRIPLES: "demo", Task.ENTITIES: "ner"}


@dataclass
class TrainConfig:
    """One training run. ``max_steps`` (when set) overrides ``epochs``; ``max_minutes`` is a safety
    net; ``dropout`` ``None`` keeps the encoder config's (0.1 for the demo encoder); ``token_noise``
    is the share of input tokens replaced at random in each batch (``training.train.noise_tokens``,
    labels unchanged; 0 turns it off); ``ema`` is the decay of an exponential moving average of the
    weights, updated after every step and exported instead of the last step's (0 turns it off).
    ``xla`` compiles the training step with XLA (``training.train.XLA_LENGTHS``: every batch then has
    one of a few fixed shapes, each compiled once).
    ``serve_length`` (``None``: ``max_length``) is the ``max_length`` written to ``model.json``: the
    longest input the server gives the model, longer texts read in windows of it; a model reads best
    the positions its corpus filled (the demo corpus: 99% of its texts within 94 tokens).
    ``task``:
    ``triples`` (GPLinker) or ``entities`` (typed GlobalPointer NER); ``name`` ``None`` is ``demo``
    or ``ner`` by task; ``threshold`` is the score threshold written to ``model.json`` (the decoder
    keeps what scores above it), with ``link_rule`` for a triples model (``nlp.decoding.LINK_RULES``)."""

    train_path: Path
    out_dir: Path
    vocab_path: Path = DEMO_VOCAB
    epochs: int = 4
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int = 200
    max_steps: int | None = None
    max_minutes: float = 22.0
    dropout: float | None = None
    token_noise: float = 0.0
    ema: float = 0.0
    xla: bool = False
    max_length: int = 128
    serve_length: int | None = None
    head_size: int = 64
    seed: int = 1
    task: str = "triples"
    name: str | None = None
    version: str = "1"
    threshold: float = 0.0
    link_rule: str = "both"
    bert_config: dict[str, Any] = field(default_factory=lambda: dict(DEMO_BERT_CONFIG))

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """What no run could train with, each as ``field ...`` (NaN fails every range here).

        >>> TrainConfig(Path("t.jsonl"), Path("m"), learning_rate=float("nan"))
        Traceback (most recent call last):
        ...
        ValueError: learning_rate must be a positive finite number, got nan
        """
        out = []
        for name in ("learning_rate", "max_minutes"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                out.append(f"{name} must be a positive finite number, got {value!r}")
        for name, value, low in (
            ("epochs", self.epochs, 1),
            ("batch_size", self.batch_size, 1),
            ("warmup_steps", self.warmup_steps, 0),
            ("max_steps", 1 if self.max_steps is None else self.max_steps, 1),
        ):
            if value < low:
                out.append(f"{name} must be at least {low}, got {value!r}")
        for name, value, high in (
            ("dropout", 0.0 if self.dropout is None else self.dropout, MAX_DROPOUT),
            ("token_noise", self.token_noise, MAX_TOKEN_NOISE),
            ("ema", self.ema, MAX_EMA),
        ):
            if not 0.0 <= value <= high:
                out.append(f"{name} must be 0 to {high}, got {value!r}")
        if self.serve_length is not None and not 3 <= self.serve_length <= self.max_length:
            out.append(
                f"serve_length must be 3 to max_length ({self.max_length}), got {self.serve_length!r}"
            )
        if not 0 <= self.seed < 2**32:
            out.append(f"seed must be 0 to 2**32 - 1, got {self.seed!r}")
        if not math.isfinite(self.threshold):
            out.append(f"threshold must be a finite number, got {self.threshold!r}")
        if self.task not in TASK_NAMES:
            out.append(f"task must be one of {', '.join(TASK_NAMES)}, got {self.task!r}")
        if self.link_rule not in LINK_RULES:
            out.append(f"link_rule must be one of {', '.join(LINK_RULES)}, got {self.link_rule!r}")
        return out
