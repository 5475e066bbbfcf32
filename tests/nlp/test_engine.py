import pytest

from nlp import engine
from nlp.engine import resolve_tensors
from nlp.errors import ModelLoadError
from nlp.tasks import PredicateSchema, Task

RANKS = {"ids:0": 2, "seg:0": 2, "e:0": 4, "h:0": 4, "t:0": 4, "flat:0": 3}
SIGNATURE = (
    {"segment": "seg:0", "Input-Token": "ids:0"},
    {"tail": "t:0", "entity": "e:0", "head": "h:0"},
)


class _FivePredicates:
    predicates = tuple(PredicateSchema(f"p{i}", "人物", "地点") for i in range(5))
    entity_types = ()
    link_rule = "both"


def _resolve(inputs=None, outputs=None, n_outputs=3, signature=SIGNATURE):
    def lookup(name, field):
        if name not in RANKS:
            raise ModelLoadError(f"{field}: {name} missing", field=field)
        return name

    return resolve_tensors(
        inputs, outputs, n_outputs, signature=signature, where="m", lookup=lookup, rank=RANKS.get
    )


def test_engine_resolve_tensors_from_the_signature_in_role_order():
    # the input naming "token" is the token ids; outputs in key order (entity, head, tail)
    assert _resolve() == (["ids:0", "seg:0"], ["e:0", "h:0", "t:0"])
    assert _resolve(("seg:0", "ids:0"), ["t:0"], 1) == (["seg:0", "ids:0"], ["t:0"])


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"signature": None}, "inputs", "names no input tensors"),
        ({"inputs": ("ids:0", "seg:0"), "signature": None}, "outputs", "names no output tensors"),
        ({"signature": ({"a": "ids:0"}, SIGNATURE[1])}, "inputs", "1 inputs"),
        ({"n_outputs": 1}, "outputs", "the model has 3 outputs, the task needs 1"),
        ({"outputs": ["e:0", "nope:0", "t:0"]}, "outputs[1]", "nope:0 missing"),
        ({"outputs": ["e:0", "flat:0", "t:0"]}, "outputs[1]", "rank 3, expected 4"),
        ({"inputs": ("ids:0", "e:0")}, "inputs[1]", "rank 4, expected 2"),
    ],
)  # fmt: skip
def test_engine_resolve_tensors_names_the_field_in_every_error(kwargs, field, message):
    with pytest.raises(ModelLoadError, match=message) as info:
        _resolve(**kwargs)
    assert info.value.field == field


def test_engine_check_output_heads_names_the_output_and_what_model_json_says():
    expected = Task.TRIPLES.output_heads(_FivePredicates())
    engine.check_output_heads([("e:0", 2), ("h:0", 5), ("t:0", None)], expected, "m")  # fits
    engine.check_output_heads([("e:0", 24)], (), "m")  # nothing expected: not checked
    with pytest.raises(ModelLoadError) as info:
        engine.check_output_heads([("e:0", 2), ("h:0", 24), ("t:0", 24)], expected, "m")
    assert info.value.field == "outputs[1]"
    assert info.value.message == (
        "m: output h:0 has 24 heads, but model.json makes it the head output, which has 5 (one "
        "per predicate in model.json): model.json must list all the model's predicates, in its "
        "output order"
    )
    with pytest.raises(ModelLoadError, match="role order") as info:
        engine.check_output_heads([("h:0", 5), ("e:0", 2), ("t:0", 5)], expected, "m")
    assert info.value.field == "outputs[0]"


def test_engine_warm_up_failure_is_a_model_load_error_naming_the_shape():
    class Failing(engine.WarmedShapes):
        shapes = frozenset({(1, 16)})

        def __init__(self) -> None:
            pass

        def _run(self, token_ids, segment_ids):
            raise RuntimeError(
                "Graph execution error:\n\nindices[0,3] = 21410 is not in [0, 21410)\n  [[node]]"
            )

    with pytest.raises(ModelLoadError) as info:
        Failing()._warm(21411, 0, "some/model")
    assert "\n" not in info.value.message
    assert info.value.message.startswith(
        "some/model: the warm-up run of shape (1, 16) failed: indices[0,3] = 21410 is not in"
    )


def test_engine_cpu_facts_read_the_flags(monkeypatch):
    monkeypatch.setattr(engine, "_cpu_flags", lambda: {"avx512f", "amx_bf16"})
    assert engine.cpu_supports_bf16()
    monkeypatch.setattr(engine, "_cpu_flags", lambda: {"avx512f", "avx512_vnni"})
    assert not engine.cpu_supports_bf16()
