"""bert4keras GPLinker (triples) and GlobalPointer NER (entities) models.

The heads follow the bert4keras GPLinker example: an entity GlobalPointer with 2 heads (subject,
object) and RoPE, and two predicate GlobalPointers (head-head and tail-tail) without RoPE or the
lower-triangle mask. Inputs are named ``Input-Token`` and ``Input-Segment`` (bert4keras's names), the
outputs ``entity``, ``head`` and ``tail`` (or ``entities``), which sort in role order.
"""

from __future__ import annotations

from typing import Any

from bert4keras.backend import keras
from bert4keras.layers import EfficientGlobalPointer
from bert4keras.models import build_transformer_model

TINY_BERT_CONFIG: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}


def _encoder(bert_config: dict[str, Any], checkpoint_path: str | None = None) -> Any:
    config = dict(bert_config)
    if "vocab_size" not in config:
        raise ValueError("bert config needs vocab_size")
    return build_transformer_model(checkpoint_path=checkpoint_path, model="bert", **config)


def build_gplinker(
    bert_config: dict[str, Any],
    n_predicates: int,
    *,
    head_size: int = 64,
    checkpoint_path: str | None = None,
) -> Any:
    """A GPLinker model: outputs ``entity`` (B, 2, L, L), ``head`` and ``tail`` (B, P, L, L)."""
    base = _encoder(bert_config, checkpoint_path)
    hidden = base.output
    entity = EfficientGlobalPointer(heads=2, head_size=head_size, name="entity")(hidden)
    head = EfficientGlobalPointer(
        heads=n_predicates, head_size=head_size, RoPE=False, tril_mask=False, name="head"
    )(hidden)
    tail = EfficientGlobalPointer(
        heads=n_predicates, head_size=head_size, RoPE=False, tril_mask=False, name="tail"
    )(hidden)
    return keras.models.Model(base.inputs, [entity, head, tail])


def build_ner(
    bert_config: dict[str, Any],
    n_types: int,
    *,
    head_size: int = 64,
    checkpoint_path: str | None = None,
) -> Any:
    """A typed GlobalPointer NER model: output ``entities`` (B, T, L, L)."""
    base = _encoder(bert_config, checkpoint_path)
    out = EfficientGlobalPointer(heads=n_types, head_size=head_size, name="entities")(base.output)
    return keras.models.Model(base.inputs, out)
