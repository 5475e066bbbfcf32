"""The demo corpus's schema: 24 DuIE predicates with their subject and object types.

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


def schema_documents() -> list[dict[str, str]]:
    """The schema as ``model.json`` predicate entries (DuIE ``all_50_schemas`` field names)."""
    return [{"predicate": p, "subject_type": s, "object_type": o} for p, s, o in SCHEMA]
