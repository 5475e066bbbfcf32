"""JSON on one line for any reader: what every JSON-lines writer of the project (``spo extract``'s
output, ``spo evaluate --errors``, the JSON log format) escapes beyond JSON itself.

U+0085, U+2028 and U+2029 are valid unescaped in a JSON string, but ``str.splitlines()`` (and readers
built on it) breaks a line at each: written as ``\\uXXXX`` escapes, a record stays one line.

>>> "a\u2028b".translate(LINE_BREAKS)
'a\\\\u2028b'
"""

from __future__ import annotations

LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})
