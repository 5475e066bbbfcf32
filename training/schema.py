"""The demo corpus's schema: 24 DuIE predicates with their subject and object types, and the entity
types of the NER demo model with how a record's named entities become labelled spans.

What training needs of the corpus (``training.train`` writes it into ``model.json``); importing it
needs no Faker. The generator (``training.corpus``) and its phrasings (``training.wordlists``) use it.
"""

from __future__ import annotations

SCHEMA: tuple[tuple[str, str, str], ...] = (
    # (predicate, subject_type, object_type)
    ("出生地", "人物", "地点"),
    ("出生日期", "人物", "Date"),
    ("国籍", "人物", "国家"),
    ("毕业院校", "人物", "学校"),
    ("妻子", "人物", "人物"),
    ("丈夫", "人物", "人物"),
    ("父亲", "人物", "人物"),
    ("母亲", "人物", "人物"),
    ("作者", "图书作品", "人物"),
    ("出版社", "书籍", "出版社"),
    ("导演", "影视作品", "人物"),
    ("主演", "影视作品", "人物"),
    ("编剧", "影视作品", "人物"),
    ("歌手", "歌曲", "人物"),
    ("作词", "歌曲", "人物"),
    ("作曲", "歌曲", "人物"),
    ("所属专辑", "歌曲", "音乐专辑"),
    ("创始人", "企业", "人物"),
    ("董事长", "企业", "人物"),
    ("总部地点", "企业", "地点"),
    ("成立日期", "机构", "Date"),
    ("首都", "国家", "城市"),
    ("祖籍", "人物", "地点"),
    ("民族", "人物", "文本"),
)
PREDICATES = tuple(p for p, _, _ in SCHEMA)
SPOUSE_INVERSE = {"妻子": "丈夫", "丈夫": "妻子"}


# Predicates that link at most once in a text, so the decoder keeps their best-scoring links
# (``nlp.decoding.CARDINALITIES``): once per subject and per object for a country's capital (and a city
# is one country's capital) and a spouse (a husband has one wife, as the corpus writes them); once per
# subject for what a person, a company or a place has one of (one birthplace, one father, one founding
# date, ...). Chosen from what the predicates mean, not from scores; the others stay unlimited (a book
# with two authors, a song with two singers). Parallel statements (``A、B分别成立于X、Y``) are where the
# limits pay: without them a crossed link (A, Y) can pass the threshold beside the straight one.
ONE_TO_ONE = ("首都", "妻子", "丈夫")
MANY_TO_ONE = ("出生地", "出生日期", "父亲", "母亲", "总部地点", "成立日期", "祖籍", "民族")
CARDINALITY = dict.fromkeys(ONE_TO_ONE, "one_to_one") | dict.fromkeys(MANY_TO_ONE, "many_to_one")


def schema_documents() -> list[dict[str, str]]:
    """The schema as ``model.json`` predicate entries (DuIE ``all_50_schemas`` field names)."""
    return [
        {"predicate": p, "subject_type": s, "object_type": o}
        | ({"cardinality": CARDINALITY[p]} if p in CARDINALITY else {})
        for p, s, o in SCHEMA
    ]


# Entity types of the NER demo model (task ``entities``): the schema's argument types, coarsened to
# what a reader can tell from the words (a company, a school and a publisher are all 机构; a book, a
# film, a song and an album are all 作品; a country and a city are 地点).
ENTITY_TYPES: tuple[str, ...] = ("人物", "地点", "机构", "作品", "日期", "民族")
SCHEMA_ENTITY_TYPE: dict[str, str] = {
    "人物": "人物",
    "地点": "地点",
    "国家": "地点",
    "城市": "地点",
    "Date": "日期",
    "学校": "机构",
    "出版社": "机构",
    "企业": "机构",
    "机构": "机构",
    "图书作品": "作品",
    "书籍": "作品",
    "影视作品": "作品",
    "歌曲": "作品",
    "音乐专辑": "作品",
    "文本": "民族",
}


def triple_entities(triples: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """The typed arguments of ``triples`` (``ENTITY_TYPES``), first mention first.

    >>> triple_entities([("张三", "出生地", "北京"), ("北京", "首都", "x")])
    [('张三', '人物'), ('北京', '地点'), ('x', '地点')]
    """
    types = {p: (SCHEMA_ENTITY_TYPE[s], SCHEMA_ENTITY_TYPE[o]) for p, s, o in SCHEMA}
    out: dict[str, str] = {}
    for s, p, o in triples:
        out.setdefault(s, types[p][0])
        out.setdefault(o, types[p][1])
    return list(out.items())


def entity_spans(text: str, entities: list[tuple[str, str]]) -> list[tuple[int, int, str]]:
    """Character spans ``(start, end, type)`` of every occurrence of every named entity in ``text``,
    except occurrences inside a longer one (``济南`` within ``济南大学``). Sorted.

    >>> entity_spans("王芳去了济南大学和济南", [("济南", "地点"), ("济南大学", "机构"), ("王芳", "人物")])
    [(0, 2, '人物'), (4, 8, '机构'), (9, 11, '地点')]
    """
    found: set[tuple[int, int, str]] = set()
    for name, type_ in entities:
        if not name:
            continue
        at = text.find(name)
        while at >= 0:
            found.add((at, at + len(name), type_))
            at = text.find(name, at + 1)
    return sorted(
        (s, e, t)
        for s, e, t in found
        if not any(s2 <= s and e <= e2 and (e2 - s2) > (e - s) for s2, e2, _ in found)
    )
