import doctest
from pathlib import Path

import pytest

from nlp import vocab as vocab_module
from nlp.errors import ModelLoadError
from nlp.vocab import read_vocab

SPECIALS = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n"


def _write(tmp_path: Path, data: str | bytes) -> Path:
    path = tmp_path / "vocab.txt"
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def test_vocab_reads_ids_as_bert4keras_does(tmp_path, vocab_path):
    """Same ids as bert4keras's ``load_vocab``: the fixture vocab, and lines ending in \\r\\n or \\r
    or holding more than one word (the first is the token)."""
    from bert4keras.tokenizers import load_vocab

    assert read_vocab(vocab_path) == load_vocab(str(vocab_path))
    odd = _write(tmp_path, SPECIALS.replace("\n", "\r\n") + "中 12\r国\n\u3000\n##ab\n")
    assert read_vocab(odd) == load_vocab(str(odd))
    assert read_vocab(odd)["国"] == 5 and read_vocab(odd)[""] == 6  # a blank line is a token


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # A repeated token: bert4keras would move it to its later line and every id after it down.
        (SPECIALS + "中\n国\n中\n", "token '中' on lines 5 and 7: each token must be written once"),
        (SPECIALS + "中\n\n\n", "a blank line on lines 6 and 7"),
        (SPECIALS + "中\n中\n国\n国\n", r"on lines 5 and 6 \(2 repeated lines in all\)"),
        ("", "the vocab is empty"),
        ("\n".join(["[PAD]", "[UNK]", "[SEP]", "中"]), r"the vocab lacks \[CLS\]"),
        (SPECIALS.encode() + "中\n".encode("gbk"), r"not UTF-8 text \(line 5: invalid"),
        # Saved by an editor that adds one: the first token was "\ufeff[PAD]" ("lacks [PAD]").
        ("\ufeff" + SPECIALS, r"starts with a byte-order mark \(U\+FEFF\)"),
    ],
    ids=["repeated-token", "blank-lines", "several-repeats", "empty", "no-cls", "not-utf8", "bom"],
)
def test_vocab_refuses_a_bad_file_naming_it(tmp_path, data, message):
    path = _write(tmp_path, data)
    with pytest.raises(ModelLoadError, match=message) as info:
        read_vocab(path)
    assert info.value.message.startswith(f"{path}: ")


def test_vocab_that_cannot_be_read_is_a_model_load_error(tmp_path, monkeypatch):
    path = _write(tmp_path, SPECIALS)

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)  # root ignores chmod
    with pytest.raises(ModelLoadError, match=f"{path}: cannot read the vocab: Permission denied"):
        read_vocab(path)


def test_vocab_doctests():
    assert doctest.testmod(vocab_module).failed == 0
