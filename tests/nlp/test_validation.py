import pytest

from nlp.errors import InvalidInput, TextTooLong
from nlp.validation import check_text


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        (7, InvalidInput, "t must be a string, got number"),
        (None, InvalidInput, "t must be a string, got null"),
        (b"bytes", InvalidInput, "t must be a string, got bytes"),
        ("长" * 6, TextTooLong, "t has 6 characters; the limit is 5"),
        ("ab\x00", InvalidInput, "t contains NUL at index 2"),
        ("a\ud800", InvalidInput, "t contains a lone surrogate (U+D800) at index 1"),
    ],
)
def test_validation_refuses_with_code_and_field(text, error, message):
    with pytest.raises(error) as info:
        check_text(text, 5, "t")
    assert info.type is error and info.value.field == "t"
    assert info.value.message.startswith(message)


@pytest.mark.parametrize("text", ["", "长" * 5, "😀\U0001f600", "e\u0301", "\ufeff\u200b", "\r\n"])
def test_validation_accepts_valid_text(text):
    assert check_text(text, 5) is text
