"""Build the project's BERT-style vocabulary, ``vocab/vocab.txt``, deterministically.

No pretrained vocab can be downloaded here, so the demo model uses one built from Unicode
ranges: special tokens, every CJK Unified Ideograph (U+4E00-U+9FFF), ASCII and full-width letters
and digits, common Chinese and ASCII punctuation and a few frequent English word pieces. The same
inputs always give the same file (and so the same sha256, which ``model.json`` records).

    python -m training.vocab [--out vocab/vocab.txt]
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "vocab" / "vocab.txt"

SPECIAL = ["[PAD]", *(f"[unused{i}]" for i in range(1, 100)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# Chinese (full-width) punctuation that occurs in everyday text, then ASCII punctuation.
CHINESE_PUNCT = "，。、；：？！“”‘’《》〈〉（）【】「」『』〔〕·—…～－／％＋＝＜＞＠＃＆＊￥"
ASCII_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
OTHER_SYMBOLS = "°℃×÷±√∶•©®™€£¥§"


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Frequent English word pieces: whole words, then ``##`` continuations (WordPiece style).
ENGLISH_WORDS = _words(
    "the of and to in is for on with by at from as an be this that it are was or not you we he she "
    "they his her its new one two all more about can will has have had but what which who when "
    "there their ai app bert china news music film book co ltd inc group tech data web "
    "http https www com cn org net html"
)
ENGLISH_PIECES = _words("s es ed ing er ers ly tion al ic ent an on in en ar or le re th st ne")


def vocab_tokens() -> Iterator[str]:
    """All tokens, in file order, without duplicates."""
    seen: set[str] = set()

    def once(tokens: Iterable[str]) -> Iterator[str]:
        for tok in tokens:
            if tok not in seen:
                seen.add(tok)
                yield tok

    yield from once(SPECIAL)
    yield from once(chr(c) for c in range(0x4E00, 0xA000))
    yield from once("0123456789")
    yield from once("abcdefghijklmnopqrstuvwxyz")
    # Full-width digits and letters, both cases (for vocabularies used without lower-casing).
    yield from once(chr(c) for c in range(0xFF10, 0xFF1A))
    yield from once(chr(c) for c in range(0xFF21, 0xFF3B))
    yield from once(chr(c) for c in range(0xFF41, 0xFF5B))
    yield from once(CHINESE_PUNCT)
    yield from once(ASCII_PUNCT)
    yield from once(OTHER_SYMBOLS)
    yield from once(ENGLISH_WORDS)
    yield from once(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789")
    yield from once(f"##{p}" for p in ENGLISH_PIECES)


def write_vocab(path: Path = DEFAULT_PATH) -> str:
    """Write the vocab file (one token a line, ``\\n`` endings) and return its sha256."""
    data = "".join(f"{tok}\n" for tok in vocab_tokens()).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    # In a checkout the project's vocab/ folder; installed (no such folder beside the package) the
    # path must be given: the default would write into site-packages.
    in_checkout = DEFAULT_PATH.parent.is_dir()
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_PATH if in_checkout else None,
        required=not in_checkout,
        help="where to write vocab.txt" + (f" (default: {DEFAULT_PATH})" if in_checkout else ""),
    )
    args = parser.parse_args(argv)
    digest = write_vocab(args.out)
    count = sum(1 for _ in vocab_tokens())
    print(f"{args.out}: {count} tokens, sha256 {digest}")


if __name__ == "__main__":
    main()
