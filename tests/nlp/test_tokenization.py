import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nlp.tokenization import Tokenizer

EDGE_CASES = {
    "plain": "周杰伦出生于台湾省新北市。",
    "fullwidth": "ＡＢＣ１２３，公司！（全角）",
    "traditional": "臺灣電影《臥虎藏龍》導演李安",
    "emoji_zwj": "家庭👨‍👩‍👧‍👦照片😀和🇨🇳旗",
    "combining": "Café e\u0301t\u00e9 naïve",
    "cjk_extension": "𠀀𪚥龘𡈽字",
    "whitespace_control": " \t前\n后\r\x00中\x07间\u200b\u3000尾 ",
    "unknown_words": "abc😀xyz qq",
    "turkish_i": "İstanbul ﬁle ß",
    "mixed": "2024年3月5日，Apple的CEO在北京说：“Hello, world!”",
    "only_spaces": "   \n\t ",
    "empty": "",
    "long_word": "a" * 500 + "中",
    "separators": "鲁迅\u2028原名\u2029周树人 a\u2029b",
}


@pytest.fixture(scope="module")
def tokenizer(vocab_path):
    return Tokenizer.from_file(vocab_path)


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_tokenization_offsets_are_valid_for_edge_cases(tokenizer, name):
    text = EDGE_CASES[name]
    enc = tokenizer.encode(text)
    assert len(enc.token_ids) == len(enc.offsets)
    previous_start = 0
    for start, end in enc.offsets:
        assert 0 <= start < end <= len(text)
        assert start >= previous_start
        assert text[start:end].strip() != ""
        previous_start = start


def test_tokenization_line_and_paragraph_separators_are_spaces(tokenizer):
    """U+2028 and U+2029 were [UNK] tokens (bert4keras's space is category Zs only), which the
    NER model took into an entity: "\u2029浙江绍兴"."""
    separated = tokenizer.encode("出生于\u2029浙江 ab\u2028cd")
    spaced = tokenizer.encode("出生于 浙江 ab cd")
    assert separated.token_ids == spaced.token_ids
    assert separated.offsets == spaced.offsets
    assert tokenizer.unk_id not in separated.token_ids


def test_tokenization_unknown_words_map_to_unk_with_their_characters(tokenizer):
    text = "好😀👍x"
    enc = tokenizer.encode(text)
    unk = [
        (s, e)
        for tid, (s, e) in zip(enc.token_ids, enc.offsets, strict=True)
        if tid == tokenizer.unk_id
    ]
    assert [text[s:e] for s, e in unk] == ["😀👍x"]


@pytest.mark.parametrize(
    "text",
    [
        "周杰伦出生于台湾省新北市。",
        "abc 中文 def，123！",
        "bert的作者是google公司",
        "Hello World 你好",
    ],
)
def test_tokenization_agrees_with_bert4keras_rematch_on_ordinary_text(tokenizer, text):
    b4k = tokenizer.bert4keras
    tokens = b4k.tokenize(text)[1:-1]
    mapping = b4k.rematch(text, tokens)
    enc = tokenizer.encode(text)
    assert enc.token_ids == b4k.tokens_to_ids(tokens)
    assert enc.offsets == [(m[0], m[-1] + 1) for m in mapping]


def test_tokenization_accepts_a_plain_dict_and_requires_special_tokens():
    tok = Tokenizer({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "中": 4})
    assert tok.encode("中文").token_ids == [4, 1]
    with pytest.raises(ValueError, match=r"\[UNK\]"):
        Tokenizer({"[PAD]": 0, "[CLS]": 2, "[SEP]": 3})


def test_tokenization_from_file_refuses_a_vocab_that_would_shift_ids(tmp_path):
    """A repeated line moved every later token one id down (bert4keras's ``load_vocab``)."""
    from nlp.errors import ModelLoadError

    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n中\n\n\n国\n", encoding="utf-8")
    with pytest.raises(ModelLoadError, match=f"{path}: a blank line on lines 6 and 7"):
        Tokenizer.from_file(path)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_tokenization_property_any_string_gives_valid_offsets(tokenizer, text):
    enc = tokenizer.encode(text)
    assert len(enc.words) == len(enc.offsets)
    for (start, end), (first, last) in zip(enc.offsets, enc.words, strict=True):
        assert 0 <= first <= start < end <= last <= len(text)


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789é", max_size=60)
    | st.sampled_from(["a" * 200, "a" * 201, "ab" * 100 + "ꙮ", "unaffable", "playing"])
)
def test_tokenization_word_pieces_are_bert4kerass(tokenizer, word):
    assert tokenizer.word_pieces(word) == tokenizer.bert4keras._word_piece_tokenize(word)


class _CountingVocab(dict):
    lookups = 0

    def __contains__(self, key):
        type(self).lookups += 1
        return super().__contains__(key)


def test_tokenization_word_pieces_try_no_candidate_longer_than_the_vocab(vocab_path):
    """bert4keras tries every end of a word: 20,100 lookups for 200 letters of which only single
    letters are pieces, and 64 texts of 49 such words took seconds before any limit applied."""
    from nlp.vocab import read_vocab

    vocab = read_vocab(vocab_path)
    tok = Tokenizer(vocab)
    tok._vocab = _CountingVocab(tok._vocab)
    longest = max(len(t) for t in vocab)
    word = "qxzjkv" * 33 + "ꙮ"  # 199 characters, the last one in no piece: the whole word is [UNK]
    assert tok.word_pieces(word) == [word]
    assert _CountingVocab.lookups <= len(word) * longest


def test_tokenization_a_word_takes_in_its_marks_and_every_piece_knows_its_word():
    """A combining accent or a variation selector after a character normalized to nothing and was
    left out of every span (``鲁迅`` of ``鲁迅\u0301``); a span ending on the piece ``l`` of ``lu``
    cut the word in half (``鲁迅L``)."""
    tok = Tokenizer(
        {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "迅": 4, "l": 5, "##u": 6, "x": 7}
    )
    enc = tok.encode("迅\u0301Lu x\ufe0f\u200d 迅\u0301\u0301")
    assert enc.token_ids == [4, 5, 6, 7, 4]
    assert enc.offsets == [(0, 2), (2, 3), (3, 4), (5, 8), (9, 12)]
    assert enc.words == [(0, 2), (2, 4), (2, 4), (5, 8), (9, 12)]
    # A mark after a space belongs to nothing; one inside a word is the word's already.
    assert tok.encode(" \u0301迅").offsets == [(2, 3)]
    assert tok.encode("l\u0301u").offsets == [(0, 1), (2, 3)]
    # An enclosing mark (which no normalization drops), and a cased vocab, which keeps every mark:
    # still the character's, not a word of their own.
    assert tok.encode("迅\u20dd").words == [(0, 2)]
    cased = Tokenizer(tok._vocab, do_lower_case=False)
    assert cased.words("迅\u0301x") == [("迅", [0], 2), ("x", [2], 3)]
    # Pieces join letter to letter, digit to digit: "x3" may name "x", "lu" is one word.
    digits = Tokenizer({**tok._vocab, "##3": 8})
    assert digits.encode("x3").words == [(0, 1), (1, 2)]


def test_tokenization_spans_are_whole_words():
    from nlp.pipeline import Extractor, Window

    tok = Tokenizer({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "鲁": 4, "l": 5, "##u": 6})
    text = "鲁Lu鲁"
    enc = tok.encode(text)
    span = Extractor._span(None, text, enc, Window(0, 0, len(enc)), 1, 2)  # type: ignore[arg-type]
    assert (span.start, span.end, span.text) == (0, 3, "鲁Lu")
    span = Extractor._span(None, text, enc, Window(0, 0, len(enc)), 3, 4)  # type: ignore[arg-type]
    assert (span.start, span.end, span.text) == (1, 4, "Lu鲁")
