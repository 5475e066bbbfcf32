"""The one text check: what a text must be before the model sees it, for the library, REST and batch.

A text is a ``str`` of at most ``max_chars`` code points, without NUL, that encodes to UTF-8 (no lone
surrogate). Each failure names its ``field`` and has a stable code: ``invalid_input`` or
``text_too_long``. The service, the batch command and ``Extractor`` all call this function, so the same
text gets the same answer (and code) whichever way it arrives.

>>> check_text("李白", 10)
'李白'
>>> check_text("a\\x00b", 10, "texts[2]")
Traceback (most recent call last):
...
nlp.errors.InvalidInput: texts[2] contains NUL at index 1
"""

from __future__ import annotations

from nlp.errors import InvalidInput, TextTooLong


def check_text(text: object, max_chars: int, field: str = "text") -> str:
    """``text`` if the model may see it; else ``InvalidInput`` / ``TextTooLong`` naming ``field``."""
    if not isinstance(text, str):
        raise InvalidInput(f"{field} must be a string, got {json_type(text)}", field=field)
    if len(text) > max_chars:
        raise TextTooLong(
            f"{field} has {len(text)} characters; the limit is {max_chars}", field=field
        )
    nul = text.find("\x00")
    if nul >= 0:
        raise InvalidInput(f"{field} contains NUL at index {nul}", field=field)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            f"{field} contains a lone surrogate (U+{ord(text[exc.start]):04X}) at index {exc.start}: "
            "not valid Unicode text",
            field=field,
        ) from None
    return text


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type (what REST and JSON-lines callers sent).

    >>> [json_type(v) for v in (None, True, 1, 1.5, [], {})]
    ['null', 'boolean', 'number', 'number', 'array', 'object']
    """
    names = {bool: "boolean", int: "number", float: "number", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
