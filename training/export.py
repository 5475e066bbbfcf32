"""Write a model directory (SavedModel + ``model.json``) from a bert4keras Keras model.

Two SavedModel flavours, both loadable by ``nlp.runtime``:

- ``graph``: the model rebuilt in a TF1-style graph and saved with ``simple_save``; tensors keep their
  Keras names (``Input-Token:0``, ``Input-Segment:0``, ``entity/...``), and the manifest names them.
- ``tf2``: ``tf.saved_model.save`` of the Keras model; tensors are ``serving_default_Input-Token:0``...
  and ``StatefulPartitionedCall:0..n``, found through the ``serving_default`` signature.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from nlp import quiet_tensorflow

with quiet_tensorflow():
    import tensorflow as tf

from nlp.decoding import CARDINALITIES
from nlp.engine import first_line
from nlp.errors import ManifestError, ModelLoadError
from nlp.manifest import VOCAB_NAME, load_manifest, write_manifest
from nlp.tasks import Task
from nlp.vocab import read_vocab

EXPORT_MODES = ("graph", "tf2")


def _save_graph(build: Callable[[], Any], weights: list[Any], path: Path) -> dict[str, Any]:
    graph = tf.Graph()
    with graph.as_default():
        session = tf.compat.v1.Session(graph=graph)
        tf.compat.v1.keras.backend.set_session(session)
        try:
            model = build()
            session.run(tf.compat.v1.global_variables_initializer())
            model.set_weights(weights)
            outputs = model.outputs
            tf.compat.v1.saved_model.simple_save(
                session,
                str(path),
                inputs={t.name.split(":")[0]: t for t in model.inputs},
                outputs={name: t for name, t in zip(model.output_names, outputs, strict=True)},
            )
            return {
                "inputs": {"token_ids": model.inputs[0].name, "segment_ids": model.inputs[1].name},
                "outputs": [t.name for t in outputs],
            }
        finally:
            session.close()


def export_model_dir(
    build: Callable[[], Any],
    weights: list[Any],
    out_dir: str | Path,
    manifest: dict[str, Any],
    *,
    mode: str = "graph",
    force: bool = False,
    vocab: str | Path | None = None,
) -> Path:
    """Build the model with ``build()``, load ``weights``, save it with ``manifest`` into ``out_dir``.

    ``build`` is called again inside a fresh graph for the ``graph`` mode, so pass the builder, not a
    model. ``vocab`` is copied in as ``vocab.txt`` (and ``model.json`` names it so): the directory is
    self-contained. It is written to a temporary sibling and renamed into place at the end, so a
    failed export never leaves a half-written model directory (and a vocab inside ``out_dir`` is
    read before the old directory goes).
    """
    if mode not in EXPORT_MODES:
        raise ValueError(f"mode must be one of {EXPORT_MODES}, got {mode!r}")
    out = Path(out_dir)
    with staged_model_dir(out, force=force) as saved:
        document = dict(manifest)
        try:
            if mode == "graph":
                document.update(_save_graph(build, weights, saved))
            else:
                model = build()
                model.set_weights(weights)
                tf.saved_model.save(model, str(saved))
                document.pop("inputs", None)
                document.pop("outputs", None)
        except tf.errors.OpError as exc:  # a full disk, a quota: TensorFlow's own error type
            raise OSError(f"cannot write {out}: {first_line(exc)}") from None
        if vocab is not None:
            shutil.copyfile(vocab, saved / VOCAB_NAME)
            document["vocab"] = {**document["vocab"], "path": VOCAB_NAME}
        write_manifest(saved, document)
        try:  # what loading would refuse is refused here, before the directory takes OUT's place
            load_manifest(saved)
        except ManifestError as exc:
            raise ValueError(f"the model would not load: {exc.message}") from None
    return out


@contextlib.contextmanager
def staged_model_dir(
    out: Path, *, force: bool, inputs: Sequence[str | Path] = ()
) -> Iterator[Path]:
    """Where to write the model directory ``out``: a path (not made yet) in a temporary sibling,
    renamed to ``out`` (replacing it) when the block ends without error and removed either way, so
    a failed export never leaves a half-written model directory. The model it replaces is moved
    aside first and deleted only once the new one is in place (put back if that fails): it was
    deleted first, so a kill or an error in between lost both. What ``out`` may be is
    ``training.conversion.replaceable``'s rule (``FileExistsError`` otherwise), checked before the
    work and again before the move: a directory another run made at ``out`` meanwhile is never
    replaced without ``force``, nor one of other files at all, nor one holding one of ``inputs``."""
    from training.conversion import replaceable

    reason = replaceable(out, force=force, inputs=inputs)
    if reason is not None:
        raise FileExistsError(reason)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield staging / "model"
        reason = replaceable(out, force=force, inputs=inputs)
        if reason is not None:
            raise FileExistsError(reason)
        replaced = staging / "replaced"
        try:
            if out.exists():
                out.rename(replaced)
            (staging / "model").rename(out)
        except BaseException:  # an error, or Ctrl-C / SIGTERM between the two renames
            if replaced.exists() and not out.exists():
                replaced.rename(out)
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# -- spo export: users' own bert4keras GPLinker / GlobalPointer NER models ------------------------


def read_schema(path: str | Path) -> tuple[Task, list[Any]]:
    """Read a schema file; returns ``(task, items)``.

    Accepted: DuIE ``all_50_schemas`` (JSON lines, one ``{"object_type", "predicate",
    "subject_type"}`` object a line), the same objects as one JSON list (both give task
    ``triples`` and predicate entries in file order, duplicates dropped), or a JSON list of strings
    (entity types: task ``entities``). DuIE's ``object_type`` may be an object (``{"@value": ...}``
    in DuIE 2.0); its ``@value`` is used. An entry may add ``"cardinality"``
    (``nlp.decoding.CARDINALITIES``), written into ``model.json`` as it is.
    """
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8-sig").strip()
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{path}: not UTF-8 text (line {line}: {exc.reason})") from None
    if not text:
        raise ValueError(f"{path}: empty schema file")
    try:
        data: Any = json.loads(text)
        if isinstance(data, dict):
            data = [data]
    except json.JSONDecodeError:
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: neither a JSON list nor JSON lines: {exc}") from exc
        except (ValueError, RecursionError):
            raise ValueError(f"{path}: nested too deeply or a number too long") from None
    except (ValueError, RecursionError):  # an integer over Python's digit limit, absurd nesting
        raise ValueError(f"{path}: nested too deeply or a number too long") from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty list of schema entries")
    if all(isinstance(item, str) for item in data):
        return Task.ENTITIES, list(dict.fromkeys(data))
    predicates: dict[str, dict[str, str]] = {}
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "predicate" not in item:
            raise ValueError(f"{path}: entry {i} has no 'predicate': {item!r}")
        obj = item.get("object_type", "")
        if isinstance(obj, dict):
            obj = obj.get("@value", next(iter(obj.values()), ""))
        entry = {
            "predicate": item["predicate"],
            "subject_type": item.get("subject_type", ""),
            "object_type": obj,
        }
        if "cardinality" in item:
            entry["cardinality"] = item["cardinality"]
            if entry["cardinality"] not in CARDINALITIES:
                raise ValueError(
                    f"{path}: entry {i}: cardinality must be one of {', '.join(CARDINALITIES)}, "
                    f"got {item['cardinality']!r}"
                )
        for field, value in entry.items():
            if not isinstance(value, str):  # a null was written as the type "None"
                raise ValueError(f"{path}: entry {i}: {field} is not a string: {value!r}")
        predicates.setdefault(entry["predicate"], entry)
    return Task.TRIPLES, list(predicates.values())


# What bert4keras's BERT needs from a bert_config.json (the rest has defaults).
BERT_CONFIG_INTS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def read_bert_config(path: str | Path, vocab_tokens: int) -> dict[str, Any]:
    """The encoder config of ``path`` (a BERT ``bert_config.json``), checked enough to build the
    model: the sizes positive integers, the width a multiple of the heads, ``hidden_act`` named,
    and ``vocab_size`` (the vocab's token count when absent) at least the vocab's ``vocab_tokens``,
    whose ids must all have an embedding row. ``ValueError`` naming the file otherwise."""
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the bert config: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    except (ValueError, RecursionError):  # an integer over Python's digit limit, absurd nesting
        raise ValueError(
            f"{path}: not a bert config (nested too deeply or a number too long)"
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a bert config is a JSON object")
    config.setdefault("vocab_size", vocab_tokens)
    for key in (*BERT_CONFIG_INTS, "vocab_size"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{path}: {key!r} must be a positive integer, got {value!r}")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise ValueError(
            f"{path}: hidden_size {config['hidden_size']} is not a multiple of "
            f"num_attention_heads {config['num_attention_heads']}"
        )
    for key in ("max_position_embeddings", "type_vocab_size"):  # absent: bert4keras's defaults
        value = config.get(key)
        if key in config and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{path}: {key!r} must be a positive integer, got {value!r}")
    if not isinstance(config.get("hidden_act"), str) or not config["hidden_act"]:
        raise ValueError(f"{path}: 'hidden_act' must name an activation (\"gelu\")")
    if config["vocab_size"] < vocab_tokens:
        raise ValueError(
            f"{path}: vocab_size {config['vocab_size']} is smaller than the vocab's "
            f"{vocab_tokens} tokens: pass the vocab the model was trained with (--vocab)"
        )
    return config


def saved_arrays(weights: Path) -> int:
    """How many weight arrays ``model.save_weights`` wrote to ``weights``: the datasets of an
    ``.h5`` file, those of a ``.weights.h5`` file's model (its ``layers`` and ``vars``: a compiled
    model's file also holds its optimizer's and its metrics' state), or a TF checkpoint's variable
    values (an optimizer's slots and the save counter not counted)."""
    if weights.is_file():
        import h5py

        found: list[str] = []
        with h5py.File(weights, "r") as handle:
            handle.visititems(
                lambda name, item: found.append(name) if isinstance(item, h5py.Dataset) else None
            )
            if weights.name.endswith(".weights.h5") and "layers" in handle:
                found = [name for name in found if name.startswith(("layers/", "vars/"))]
        return len(found)
    import tensorflow as tf

    return sum(
        1
        for name, _ in tf.train.list_variables(str(weights))
        if name.endswith("/.ATTRIBUTES/VARIABLE_VALUE")
        and "OPTIMIZER_SLOT" not in name
        and not name.startswith(("optimizer/", "save_counter/"))
    )


def export_user_model(
    *,
    bert_config_path: str | Path,
    weights_path: str | Path,
    schema_path: str | Path,
    out_dir: str | Path,
    vocab_path: str | Path,
    head_size: int = 64,
    max_length: int = 256,
    name: str = "custom",
    version: str = "1",
    threshold: float = 0.0,
    link_rule: str = "both",
    do_lower_case: bool = True,
    mode: str = "graph",
    force: bool = False,
) -> Path:
    """Export a trained bert4keras GPLinker (or GlobalPointer NER) model to a model directory.

    ``weights_path`` is what ``model.save_weights`` wrote: an ``.h5``/``.weights.h5`` file or a TF
    checkpoint prefix (``best_model.weights``). The model is rebuilt from the bert config with
    ``training.gplinker`` (so layer shapes must match: same ``head_size``, number of predicates or
    types), the weights loaded, and the directory written by ``export_model_dir``.
    """
    from nlp.manifest import manifest_document, sha256_file
    from training.conversion import replaceable
    from training.gplinker import build_gplinker, build_ner

    weights = Path(weights_path)
    inputs = (
        weights,
        Path(f"{weights}.index"),
        Path(schema_path),
        Path(bert_config_path),
    )
    reason = replaceable(out_dir, force=force, inputs=inputs)
    if reason is not None:
        raise ValueError(reason)
    task, items = read_schema(schema_path)
    if task is not Task.TRIPLES and link_rule != "both":
        raise ValueError(
            f"{schema_path}: a link rule is for triples models, and this schema makes an {task} model"
        )
    try:  # the checks loading makes (UTF-8, each token once, the special tokens), before building
        tokens = len(read_vocab(vocab_path))
    except ModelLoadError as exc:
        raise ValueError(exc.message) from None
    vocab = Path(vocab_path)
    config = read_bert_config(bert_config_path, tokens)
    positions = config.get("max_position_embeddings", 512)
    if max_length > positions:
        raise ValueError(
            f"--max-length {max_length} is more than the {positions} positions of "
            f"{bert_config_path} (max_position_embeddings): use at most {positions}"
        )
    if not weights.is_file() and not Path(f"{weights}.index").is_file():
        raise ValueError(
            f"{weights}: no such weights file (an .h5 / .weights.h5 file, or a TF checkpoint "
            "prefix with its .index beside it)"
        )

    builders = {Task.TRIPLES: build_gplinker, Task.ENTITIES: build_ner}

    def build() -> Any:
        return builders[task](config, len(items), head_size=head_size)

    try:
        model = build()
    except (
        Exception
    ) as exc:  # a vocab_size or width past what memory holds (ResourceExhausted), ...
        raise ValueError(
            f"{bert_config_path}: cannot build its encoder: {type(exc).__name__}: "
            f"{first_line(exc)[:500]}"
        ) from None
    try:
        status = model.load_weights(str(weights))
        # A TF checkpoint restores what matches and leaves the rest as built (a checkpoint of
        # another architecture gave a model of random heads): every variable must come from it.
        if hasattr(status, "assert_existing_objects_matched"):
            status.assert_existing_objects_matched()
        # Nor may the file hold arrays the model has no place for: a .weights.h5 file or a
        # checkpoint of a deeper encoder (or of a triples model given an NER schema) loaded what
        # matched and dropped the rest, and the export wrote a model that was not the one trained.
        saved, built = saved_arrays(weights), len(model.weights)
        if saved != built:
            raise ValueError(
                f"the file holds {saved} weight arrays and the model built has {built} (another "
                "depth or width of encoder, or another task)"
            )
    except Exception as exc:  # h5py, TF checkpoint and Keras shape errors: each its own type
        labels = "predicates" if task is Task.TRIPLES else "entity types"
        article = "an" if task is Task.ENTITIES else "a"
        raise ValueError(
            f"{weights}: cannot load these weights into {article} {task} model of {len(items)} {labels} "
            f"(--schema), head size {head_size} (--head-size) and the encoder of "
            f"{bert_config_path} (--bert-config): {type(exc).__name__}: {first_line(exc)[:500]}"
        ) from None
    document = manifest_document(
        name=name,
        version=version,
        task=task,
        predicates=items,  # the task's labels field is the one written
        entity_types=items,
        vocab_path=VOCAB_NAME,
        vocab_sha256=sha256_file(vocab),
        max_length=max_length,
        do_lower_case=do_lower_case,
        threshold=threshold,
        link_rule=link_rule,
    )
    return export_model_dir(
        build, model.get_weights(), out_dir, document, mode=mode, force=force, vocab=vocab
    )
