"""One hostile set of texts through ``POST /v1/extract`` and through ``spo extract``: same answers.

Both paths check texts with ``nlp.validation.check_text`` and run the same model, so each text must get
the same result, or the same error code, whichever way it arrives (issue 10: they used to differ on NUL).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flask.testing import FlaskClient

from app.batch import BatchOptions, run_batch
from app.core.settings import Settings
from nlp.config import LoadOptions
from nlp.values import Extraction

HOSTILE: list[Any] = [
    "李白出生于碎叶城，他的妻子是许氏。",
    "",
    " \t\r\n",
    "a\x00b",
    "\x00",
    "好\ud800",
    "\udc00开头",
    "末尾\ud83d",
    "😀表情\U0001f600和组合字符e\u0301",
    "\ufeff字节序标记",
    "\u202e反向\u200b零宽\u3000全角空格",
    "《红楼梦》的作者是曹雪芹。" * 23,  # 299 characters: at the limit
    "长" * 300,
    "长" * 301,
    "\x00" + "长" * 301,  # too long and NUL: the length is reported first, both ways
    1,
    1.5,
    True,
    None,
    [],
    ["a"],
    {"text": "a"},
]


class _Shared:
    """The session's extractor for one batch run; the run's close() must not close it."""

    def __init__(self, extractor: Any) -> None:
        self.extractor = extractor
        self.manifest = extractor.manifest

    def plan(self, texts: Sequence[object], **options: Any) -> Any:
        return self.extractor.plan(texts, **options)

    def run(self, plan: Any, *, deadline: float | None = None) -> list[Extraction]:
        result: list[Extraction] = self.extractor.run(plan, deadline=deadline)
        return result

    def close(self) -> None:
        pass


def _rest(client: FlaskClient, value: Any) -> Any:
    response = client.post(
        "/v1/extract", data=json.dumps({"text": value}), content_type="application/json"
    )
    body = response.get_json(force=True)
    if response.status_code == 200:
        return body["results"][0]
    return {"error": body["code"]}


def test_api_batch_parity_same_answer_for_every_hostile_text(
    client: FlaskClient, settings: Settings, triples_extractor: Any, tmp_path: Path
) -> None:
    source = tmp_path / "hostile.jsonl"
    # json.dumps escapes lone surrogates as \udXXX, exactly as a client's JSON library sends them.
    source.write_text(
        "".join(json.dumps({"id": i, "text": v}) + "\n" for i, v in enumerate(HOSTILE)),
        encoding="ascii",
    )
    out = tmp_path / "out.jsonl"

    def factory(options: LoadOptions) -> _Shared:
        return _Shared(triples_extractor)

    run_batch(
        BatchOptions(
            inputs=(str(source),),
            output=str(out),
            model_dir=settings.model_dir,
            workers=0,
            max_text_chars=settings.max_text_chars,
        ),
        factory=factory,
    )
    batch = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in batch] == list(range(len(HOSTILE)))
    for value, record in zip(HOSTILE, batch, strict=True):
        by_rest = _rest(client, value)
        by_batch = (
            {"error": record["error"]["code"]}
            if "error" in record
            else {"entities": record["entities"], "triples": record["triples"]}
        )
        assert by_rest == by_batch, f"{value!r:.40}: REST {by_rest} != batch {by_batch}"
    codes = {r["error"]["code"] for r in batch if "error" in r}
    assert codes == {"invalid_input", "text_too_long"}
    assert sum("error" not in r for r in batch) == 8
