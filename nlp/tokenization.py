"""Text -> word-piece ids with character offsets into the original text.

The word-piece algorithm and character classes are bert4keras's ``Tokenizer`` (the only bert4keras
import in ``nlp``); the vocab file is read by ``nlp.vocab`` (bert4keras's rule, checked). Offsets
are computed while pre-tokenizing, one original character at a time, rather than afterwards with
``Tokenizer.rematch``: rematch searches each token's text in the normalized string, so it maps
``[UNK]`` tokens to nothing (the GPLinker example then crashes on ``mapping[i][0]``), can match a
later token inside an earlier ``[UNK]`` word, and misaligns when ``str.lower()`` changes a string's
length (``"İ".lower()`` is two characters). On ordinary text the two agree exactly
(``tests/nlp/test_tokenization.py`` checks it); on every other ``str`` ours still gives
``text[start:end]`` covering exactly the characters the token came from.

The word-piece loop is bert4keras's greedy longest match, with one bound it lacks: no candidate
is longer than the vocabulary's longest token. bert4keras tries every end down from the word's
end, so a 200-character word of letters costs 20,000 lookups and ends as one ``[UNK]`` (a request
of such words took seconds to tokenize, before any deadline or token cap could refuse it); bounded,
the same pieces come out in ``len(word) x longest`` lookups.

One class differs from bert4keras's: the line and paragraph separators U+2028 and U+2029 (Unicode
categories Zl and Zp; ``str.isspace()`` is true of both) separate words like any space. bert4keras
takes only category Zs for space, so each became an ``[UNK]`` token, which a model could take into
an entity (``"\u2029浙江绍兴"``).

>>> tok = Tokenizer({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "中": 4, "国": 5, "ab": 6})
>>> enc = tok.encode("中国 ab 😀")
>>> enc.token_ids, enc.offsets
([4, 5, 6, 1], [(0, 1), (1, 2), (3, 5), (6, 7)])
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nlp import quiet_tensorflow
from nlp.vocab import SPECIAL_TOKENS, read_vocab

# The only characters of Unicode categories Zl and Zp (LINE and PARAGRAPH SEPARATOR): spaces here.
_SEPARATORS = "\u2028\u2029"


def _joined(text: str, pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """For each piece of one word, the span of the run of pieces it is joined to: two pieces join
    where a letter meets a letter or a digit a digit (a reader cuts ``Python|3``, not ``L|u``).

    >>> _joined("Lu", [(0, 1), (1, 2)]), _joined("py3", [(0, 2), (2, 3)])
    ([(0, 2), (0, 2)], [(0, 2), (2, 3)])
    """
    runs: list[list[int]] = []
    for k, (start, _) in enumerate(pieces):
        left, right = text[pieces[k - 1][1] - 1] if k else "", text[start]
        if k and ((left.isalpha() and right.isalpha()) or (left.isdigit() and right.isdigit())):
            runs[-1].append(k)
        else:
            runs.append([k])
    return [(pieces[run[0]][0], pieces[run[-1]][1]) for run in runs for _ in run]


def _is_mark(ch: str) -> bool:
    """A character that belongs to the one before it: a combining or enclosing mark (an accent, a
    variation selector), or the zero-width joiner."""
    return ch == "\u200d" or unicodedata.category(ch) in ("Mn", "Me")


# bert4keras is not a declared dependency: it declares keras<=2.3.1, which no TensorFlow 2.21 install
# satisfies, so it is installed beside the package with --no-deps (README, "Installing from a wheel").
BERT4KERAS_INSTALL = "pip install --no-deps bert4keras==0.11.5"

# bert4keras reads its switches with ``distutils.util.strtobool``. Python 3.12 removed distutils;
# setuptools (a dependency of TensorFlow, pinned for every Python in requirements.lock) puts its own
# distutils in its place through its ``distutils-precedence.pth``. Without it, say what to install.
with quiet_tensorflow():  # bert4keras imports TensorFlow
    try:
        from bert4keras.tokenizers import Tokenizer as _B4KTokenizer
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing == "bert4keras":
            raise ModuleNotFoundError(
                f"bert4keras is not installed; install it with: {BERT4KERAS_INSTALL}",
                name="bert4keras",
            ) from None
        if missing != "distutils":
            raise
        raise ImportError(
            f"bert4keras imports distutils, which this Python ({sys.version.split()[0]}) lacks (3.12 "
            "removed it): pip install setuptools (a dependency of spo-service and TensorFlow), whose "
            "distutils takes its place, and leave SETUPTOOLS_USE_DISTUTILS unset (or 'local')"
        ) from exc


@dataclass(frozen=True)
class Encoding:
    """Word-piece ids of one text (no ``[CLS]``/``[SEP]``), each token's ``(start, end)`` offsets,
    and for each token the ``(start, end)`` of what a reader sees as one word around it: the pieces
    of a word joined letter to letter or digit to digit (``l ##u`` of ``Lu``; not ``python ##3``,
    where ``Python`` may be a name), a character with the combining marks after it. A span of tokens
    is reported as those words: never ``鲁迅L`` of ``鲁迅Lu Xun``, nor ``鲁迅`` without its accent."""

    token_ids: list[int]
    offsets: list[tuple[int, int]]
    words: list[tuple[int, int]]

    def __len__(self) -> int:
        return len(self.token_ids)


class Tokenizer:
    """bert4keras word-piece tokenization with exact character offsets for any ``str``."""

    def __init__(self, token_dict: Mapping[str, int], *, do_lower_case: bool = True) -> None:
        missing = [t for t in SPECIAL_TOKENS if t not in token_dict]
        if missing:
            raise ValueError(f"vocabulary lacks the special tokens {', '.join(missing)}")
        self._b4k = _B4KTokenizer(dict(token_dict), do_lower_case=do_lower_case)
        self._vocab = dict(token_dict)
        self.do_lower_case = do_lower_case
        self.pad_id = token_dict["[PAD]"]
        self.unk_id = token_dict["[UNK]"]
        self.cls_id = token_dict["[CLS]"]
        self.sep_id = token_dict["[SEP]"]
        self.vocab_size = max(token_dict.values()) + 1
        # No word piece (``##`` included) is longer: a longer candidate cannot be in the vocabulary.
        self._longest = max(len(t) for t in token_dict)
        self._word_maxlen: int = self._b4k._word_maxlen

    @classmethod
    def from_file(cls, path: str | Path, *, do_lower_case: bool = True) -> Tokenizer:
        """Load a BERT ``vocab.txt`` (one token a line, id = line number): ``nlp.vocab.read_vocab``,
        whose ``ModelLoadError`` names the file and what is wrong with it."""
        return cls(read_vocab(path), do_lower_case=do_lower_case)

    @property
    def bert4keras(self) -> _B4KTokenizer:
        """The underlying bert4keras tokenizer (for training code and parity tests)."""
        return self._b4k

    def _normalize(self, ch: str) -> str:
        if self.do_lower_case:
            ch = unicodedata.normalize("NFD", ch.lower())
            ch = "".join(c for c in ch if unicodedata.category(c) != "Mn")
        return ch

    def words(self, text: str) -> list[tuple[str, list[int], int]]:
        """Pre-tokenize: (normalized word, original index of each of its characters, the word's end
        in the original text). The end takes in the combining marks right after the word's last
        character (an accent, an enclosing mark, a variation selector, a zero-width joiner), whether
        the vocab's normalization drops them (uncased) or not: ``迅\u0301`` is one character to a
        reader, never ``迅`` and a word of its own.

        >>> tok = Tokenizer({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "迅": 4, "ab": 5})
        >>> tok.words("迅\u0301 ab\ufe0f")
        [('迅', [0], 2), ('ab', [3, 4], 6)]
        >>> Tokenizer(tok._vocab, do_lower_case=False).words("迅\u0301ab")
        [('迅', [0], 2), ('ab', [2, 3], 4)]
        """
        b4k = self._b4k
        out: list[tuple[str, list[int], int]] = []
        chars: list[str] = []
        origins: list[int] = []
        end = 0  # the end of the word being read
        last = -2  # the original index of the last character a word took (or a mark it took in)

        def flush() -> None:
            if chars:
                out.append(("".join(chars), origins.copy(), end))
                chars.clear()
                origins.clear()

        for i, original in enumerate(text):
            mark = last == i - 1 and _is_mark(original)
            if mark and not chars and out:  # after a word of its own (a CJK character, a mark)
                word, its, _ = out[-1]
                out[-1] = (word, its, i + 1)
                last = i
                continue
            for ch in self._normalize(original):
                if b4k._is_punctuation(ch) or b4k._is_cjk_character(ch):
                    flush()
                    out.append((ch, [i], i + 1))
                    last = i
                elif b4k._is_space(ch) or ch in _SEPARATORS:
                    flush()
                elif ord(ch) == 0 or ord(ch) == 0xFFFD or b4k._is_control(ch):
                    continue
                else:
                    chars.append(ch)
                    origins.append(i)
                    end = i + 1
                    last = i
            if mark and chars and last != i:  # dropped by the normalization: still the word's
                end = i + 1
                last = i
        flush()
        return out

    def word_pieces(self, word: str) -> list[str]:
        """bert4keras's ``_word_piece_tokenize`` (greedy longest match, ``##`` after the first piece;
        ``[word]`` when a part matches nothing or the word is over its 200 characters), trying no
        candidate longer than the vocabulary's longest token.

        >>> Tokenizer({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "ab": 4, "##c": 5}).word_pieces("abc")
        ['ab', '##c']
        """
        if len(word) > self._word_maxlen:
            return [word]
        vocab = self._vocab
        pieces: list[str] = []
        start = 0
        while start < len(word):
            end = min(len(word), start + self._longest)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    break
                end -= 1
            if end == start:
                return [word]
            pieces.append(piece)
            start = end
        return pieces

    def encode(self, text: str) -> Encoding:
        """Ids and offsets for every token of ``text``; no truncation (windowing is the caller's)."""
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        words: list[tuple[int, int]] = []
        for word, origins, end in self.words(text):
            pieces = self.word_pieces(word)
            if len(pieces) == 1 and pieces[0] == word and word not in self._vocab:
                ids.append(self.unk_id)
                offsets.append((origins[0], end))
                words.append((origins[0], end))
                continue
            first = len(offsets)
            pos = 0
            for n, piece in enumerate(pieces, 1):
                size = len(piece[2:] if piece.startswith("##") else piece)
                ids.append(self._vocab[piece])
                last = end if n == len(pieces) else origins[pos + size - 1] + 1
                offsets.append((origins[pos], last))
                pos += size
            words += _joined(text, offsets[first:])
        return Encoding(ids, offsets, words)
