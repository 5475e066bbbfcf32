"""Synthetic DuIE-style corpus: Chinese sentences with their (subject, predicate, object) triples.

No labelled corpus can be downloaded here, so the demo model learns from sentences this module
writes: Faker's ``zh_CN`` provider for people, places and companies, the project's own templates and
title lists for the rest. Deterministic from a seed. Two splits draw from disjoint name pools (every
open-class name - person, title, company, school - is assigned to a split by a stable hash), so a
held-out set never shows a name seen in training.

Records are JSON lines ``{"text": ..., "triples": [[subject, predicate, object], ...], "entities":
[[name, type], ...]}``, written by ``spo make-corpus`` (``app/cli/model.py``); ``entities`` names every
typed mention the generator placed (triple arguments, and the people, places, works and organisations
of sentences that state no relation), typed with ``training.schema.ENTITY_TYPES``, the labels of the
NER demo model::

    spo make-corpus data/train.jsonl --n 20000 --seed 1
    spo make-corpus data/heldout.jsonl --n 1000 --seed 2 --split heldout

The schema lives in ``training.schema`` (what training needs, without Faker), the templates and word
lists in ``training.wordlists``; this module is the generator.

Sentence shapes, mixed at random (shares of records, ``CorpusGenerator._body``): one fact (13%);
several facts about one subject, the subject elided (``，妻子是B``) or replaced by a pronoun after its
first mention (12%); a fact about a work or a company followed by facts about the person it names, an
entity that is object of one triple and subject of the next (9%); biography headers (``张三，男，汉族，
1962年5月生，山东济南人``, 5%); two statements in one text (7%); sentences that name people, places
and works but state no relation at all (10%), some of them near misses (``岳父``, ``在X任教``,
``制片人``); and the everyday shapes of issue 23 (44%): the credits of one work in one sentence
(``《S》由A执导，B、C主演``, ``《S》的导演是A，主演B和C``, ``A执导、B主演的《S》``, ``由A作词作曲``), the
same predicate twice (``A的首都是B，C的首都是D``), several subjects sharing an object (``《A》和《B》都是
X写的``, titles also side by side: ``《A》《B》``), subjects and objects paired by 分别, appositions and
side clauses (``美国导演A执导的《S》``, ``张三，山东济南人，1962年生，毕业于...``), both parents at once,
a birth date and place in one phrase (``莫言1955年出生于山东高密``), founders with the founding date
(``马化腾于1998年在深圳创办了腾讯``), form fields (``姓名：欧阳婧　民族：回族``), corrections where only
the right object is a fact (``《子夜》不是巴金写的，而是茅盾写的``; a denial alone states nothing), facts
about a relation's object right after its noun (``冯小刚的妻子徐帆是湖北武汉人``, ``泰国首都曼谷的
夜市``), a person's works after the person (``歌手腾格尔是蒙古族，代表作有《天堂》``), and a person named
first with a work's credits by 他/她 after it (``A的专辑《X》里有一首《S》，这首歌由他演唱并谱曲``). Every
predicate has its common verb variants and its 由/被 forms; a fact may be followed by words of no
list (``海明威的《老人与海》写的是...``) and a relation's object by what is said of that person outside the
schema, in a chain too (``钱学森...，父亲钱均夫是教育家``, ``母亲央金是一位唐卡画师``): a fact ends where its
name ends, whatever comes after; a template's year is a fact where it states
one (``张三1962年生在济南``: the birth year too); an adverb may stand between a subject and its verb
(``北京大学则创办于1898年``) and a brand may be quoted (``“小满茶饮”``); lists join with 、, 和, 与, 及,
以及; titles appear with and without 《》; dates in their everyday forms (``1990年5月3日``, ``1990年``,
``1990年5月3号``, ``1990.5.3``, ``1990.05``, ``90年``, ``一九九〇年``).

Names are drawn so that their shape gives nothing away: besides Faker's names and the lists, bare
brands (``腾讯``), schools by short name (``北大``), transliterated and minority names (``詹姆斯·卡梅隆``,
``诺兰``, ``热依扎``), kin as subjects (``我外婆``), counties and towns no list holds (``湖北仙桃``,
``内蒙古鄂托克旗``), and names and titles of any common character (GB 2312 level 1, so every
embedding the model may meet in a name is trained). Some texts carry a remark
of random common characters, an aside between facts or a chat ending: the model learns the cues of a
fact, not the words around it.
"""

from __future__ import annotations

import importlib.resources
import json
import random
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import IO, ClassVar

from faker import Faker

from training.schema import PREDICATES, SCHEMA, SPOUSE_INVERSE, triple_entities
from training.wordlists import (
    ADAPTED_FROM,
    ADAPTED_SAME,
    ALBUM_EXTRA,
    ASIDES,
    BOOK_TYPES,
    BORN,
    CAPITAL_TAILS,
    CHAT_ENDINGS,
    CLOSERS,
    COMPANY_CHARS,
    COMPANY_SUFFIXES,
    COMPOUND_SURNAMES,
    CONTINUATIONS,
    CORRECTIONS,
    COUNTRY_CAPITALS,
    COUNTY_SUFFIXES,
    CREDIT_NOUNS,
    CREDIT_TOPICS,
    CREDITS,
    DENIALS,
    DEPTS,
    DISTRICT_SUFFIXES,
    ENGLISH_TITLES,
    ETHNICITIES,
    FEMALE_CHARS,
    FIELD_COLONS,
    FIELD_HEADERS,
    FIELD_SEPARATORS,
    FIELDS,
    FILM_EXTRA,
    FOREIGN_CITIES,
    FOREIGN_FIRST_F,
    FOREIGN_FIRST_M,
    FOREIGN_LAST,
    FOUNDED,
    FOUNDER_NOUNS,
    INDUSTRIES,
    KIN_MALE,
    KIN_SUBJECTS,
    MALE_CHARS,
    MERGED_ROLES,
    MINORITY_HEADS,
    NEAR_MISSES,
    NEGATIVES,
    OBJECT_LEADS,
    OCCUPATIONS,
    OFF_SCHEMA_CREDITS,
    OPENERS,
    PARENTS,
    PERSON_IS,
    PERSON_REMARKS,
    PERSON_WORKS,
    PRONOUN_CREDITS,
    PRONOUN_INTROS,
    PRONOUN_ROLES,
    PROVINCE_CITIES,
    PROVINCE_SUFFIX,
    PUBLISHER_PATTERNS,
    PUBLISHERS_FIXED,
    REAL_SCHOOLS,
    REL_NOUNS,
    REL_VERBS,
    RESPECTIVELY,
    ROLES,
    SCHOOL_PATTERNS,
    SCHOOL_SHORT,
    SCHOOL_SHORT_PATTERNS,
    SHARED_OBJECT,
    SIDE_FACTS,
    SONG_EXTRA,
    SUBJECT_ADVERBS,
    TAIL_LEADS,
    TEMPLATES,
    TITLE_MODIFIERS,
    TITLE_NOUNS,
    TITLE_PATTERNS,
    TRANSLIT_SYLLABLES,
    WORK_KINDS,
)


def _split_of(text: str) -> str:
    """The split a name belongs to: a stable hash, the same in every process and Python version."""
    return "heldout" if zlib.crc32(text.encode("utf-8")) % 5 == 0 else "train"


@dataclass
class Person:
    name: str
    male: bool

    @property
    def pronoun(self) -> str:
        return "他" if self.male else "她"


@dataclass
class Record:
    text: str
    triples: list[tuple[str, str, str]] = field(default_factory=list)
    entities: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(
            {
                "text": self.text,
                "triples": [list(t) for t in self.triples],
                "entities": [list(e) for e in self.entities],
            },
            ensure_ascii=False,
        )


# The fact a template's {year}年 states besides its own predicate.
_YEAR_FACTS = {"出生地": "出生日期", "创始人": "成立日期"}
# Relations whose object gets facts of its own in ``_object_facts`` (spouses, authors and founders
# twice: the dev set's errors were mostly there).
_OBJECT_FACT_PREDICATES = (
    *("妻子", "丈夫", "父亲", "母亲", "作者", "导演", "主演", "编剧", "歌手"),
    *("作词", "作曲", "创始人", "董事长", "首都", "妻子", "丈夫", "作者", "创始人"),
)
# Predicates whose object may follow the relation's noun in a chain of facts (父亲钱均夫).
_NOUN_LEAD_PREDICATES = frozenset(
    {
        "妻子",
        "丈夫",
        "父亲",
        "母亲",
        "作者",
        "导演",
        "主演",
        "编剧",
        "歌手",
        "作词",
        "作曲",
        "创始人",
        "董事长",
    }
)
# Predicates whose subject is a company (or a school): its name may be quoted.
_COMPANY_PREDICATES = {p for p, s, _ in SCHEMA if s in ("企业", "机构")}

# The entity type of each slot of the NEGATIVES templates.
_NEGATIVE_SLOT_TYPES = {
    "P": "人物",
    "P2": "人物",
    "CITY": "地点",
    "CTRY": "地点",
    "BOOK": "作品",
    "BOOK2": "作品",
    "FILM": "作品",
    "SONG": "作品",
    "COM": "机构",
    "COM2": "机构",
    "SCH": "机构",
}


WORK_PRONOUNS = {
    "book": ("该书", "这本书", "此书"),
    "film": ("该片", "这部电影", "该剧"),
    "song": ("这首歌", "该曲", "这首歌曲"),
    "company": ("该公司", "公司", "这家公司"),
}


class _Clause:
    """A rendered phrase with its triples; ``elided`` is the same phrase without its leading subject."""

    def __init__(self, text: str, triples: list[tuple[str, str, str]], elided: str | None) -> None:
        self.text = text
        self.triples = triples
        self.elided = elided


_SLOT = re.compile(r"\{([^{}]+)\}")


class CorpusGenerator:
    """Deterministic sentence generator: same ``seed`` and ``split``, same records."""

    def __init__(self, seed: int = 0, split: str = "train") -> None:
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        self.split = split
        self.rng = random.Random(seed)
        self.fake = Faker("zh_CN")
        self.fake.seed_instance(seed)
        self.genders: dict[str, bool] = {}
        # Typed names placed outside triples (decorations, sentences without relations); recording
        # them draws nothing, so the texts and triples of a seed do not depend on it.
        self._mentions: list[tuple[str, str]] = []
        self.chars = _common_chars()
        self.wide = _level1_chars()

    # ---- entities ---------------------------------------------------------------------------
    def _draw(self, make: Callable[[], str]) -> str:
        """A name from this split's pool (names of the other split are redrawn)."""
        for _ in range(200):
            text = make()
            if _split_of(text) == self.split:
                return text
        raise RuntimeError("could not draw a name for this split")

    def person(self, male: bool | None = None, family: str | None = None) -> Person:
        """A person of this split; with ``family``, a Chinese name of that surname (a father)."""
        r = self.rng
        if male is None:
            male = r.random() < 0.55

        def make() -> str:
            if family is not None:
                chars = MALE_CHARS if male else FEMALE_CHARS
                return family + "".join(r.choice(chars) for _ in range(r.choice((1, 2, 2))))
            x = r.random()
            if x < 0.05:
                first = r.choice(FOREIGN_FIRST_M if male else FOREIGN_FIRST_F)
                return f"{first}·{r.choice(FOREIGN_LAST)}"
            if x < 0.12:
                return self.foreign_name()
            if x < 0.15:
                return self.minority_name()
            if x < 0.32:
                # Given names from wider pools: the characters of names and brands, or any
                # common character (GB 2312 level 1), so every character's embedding is trained.
                pool = self.chars if x < 0.22 else self.wide
                surname = self.fake.last_name()
                drawn = [r.choice(pool) for _ in range(r.choice((1, 2, 2)))]
                if len(drawn) == 2 and r.random() < 0.6:
                    # Most given names keep one character that tells the gender (婷, 伟): the
                    # direction of 妻子/丈夫 in 钱钟书与杨绛结婚 is read from the names.
                    drawn[r.randrange(2)] = r.choice(MALE_CHARS if male else FEMALE_CHARS)
                return surname + "".join(drawn)
            if r.random() < 0.03:
                # Everyday nicknames: 小李, 老周.
                return r.choice(("小", "老")) + self.fake.last_name()
            surname = r.choice(COMPOUND_SURNAMES) if r.random() < 0.04 else self.fake.last_name()
            if r.random() < 0.35:
                given = self.fake.first_name_male() if male else self.fake.first_name_female()
            else:
                chars = MALE_CHARS if male else FEMALE_CHARS
                given = "".join(r.choice(chars) for _ in range(1 if r.random() < 0.3 else 2))
            return surname + given

        name = self._draw(make)
        self.genders[name] = male
        return Person(name, male)

    def coined(self, pool: Sequence[str]) -> str:
        """A name of 2 to 4 characters of ``pool``, no word of any list (a brand, a title)."""
        r = self.rng
        return "".join(r.choice(pool) for _ in range(r.choice((2, 2, 3, 4))))

    def translit(self, low: int, high: int) -> str:
        """A transliterated word of ``low`` to ``high`` syllables (卡梅隆, 阿依古丽)."""
        return "".join(
            self.rng.choice(TRANSLIT_SYLLABLES) for _ in range(self.rng.randint(low, high))
        )

    def foreign_name(self) -> str:
        """詹姆斯·卡梅隆, 莱昂纳多·迪卡普里奥, or the family name alone (诺兰), as news writes them."""
        r = self.rng
        last = self.translit(2, 4)
        x = r.random()
        if x < 0.04:
            # J.K.罗琳, J·R·R·托尔金: initials before the family name.
            dot = r.choice((".", "·"))
            initials = [r.choice("ABCDEGHJKLMPRSTW") for _ in range(r.choice((1, 2, 2, 3)))]
            return dot.join(initials) + dot + last
        if x < 0.25:
            return last
        if x < 0.35:
            return f"{self.translit(2, 3)}·{self.translit(1, 3)}·{last}"
        return f"{self.translit(2, 4)}·{last}"

    def minority_name(self) -> str:
        """Names written without a 姓: 热依扎, 迪丽热巴, 买买提·艾力."""
        r = self.rng
        if r.random() < 0.3:
            return f"{r.choice(MINORITY_HEADS)}·{self.translit(2, 3)}"
        return self.translit(3, 4)

    def place(self) -> str:
        r = self.rng
        if r.random() < 0.08:
            country, _ = r.choice(COUNTRY_CAPITALS[1:12])
            return (
                country + r.choice(FOREIGN_CITIES) if r.random() < 0.5 else r.choice(FOREIGN_CITIES)
            )
        prov = r.choice(sorted(PROVINCE_CITIES))
        city = r.choice(PROVINCE_CITIES[prov])
        if r.random() < 0.2:  # counties and towns no list holds: 湖北仙桃, 安徽无为, 内蒙古鄂托克旗
            county = "".join(r.choice(self.wide) for _ in range(r.choice((2, 2, 2, 3))))
            suffixes = [x for x in COUNTY_SUFFIXES if x != "旗" or prov == "内蒙古"]
            county += r.choice(suffixes)
            head = r.random()
            if head < 0.55:
                return prov + county
            if head < 0.7 and city != prov:
                return prov + PROVINCE_SUFFIX.get(prov, "省") + city + "市" + county
            if head < 0.85 and city != prov:
                return city + county
            return county if county[-1] in "县市旗镇" else prov + county
        style = r.random()
        if city == prov:
            district = prov in ("北京", "上海", "天津", "重庆") and style > 0.8
            return (
                city
                + ("市" if style < 0.3 else "")
                + (self.fake.district() + "区" if district else "")
            )
        if style < 0.3:
            return prov + city
        if style < 0.55:
            return prov + PROVINCE_SUFFIX.get(prov, "省") + city + "市"
        if style < 0.75:
            return city
        if style < 0.85:
            return city + "市"
        if style < 0.93:
            return prov + PROVINCE_SUFFIX.get(prov, "省")
        return prov + city + self.fake.district() + r.choice(DISTRICT_SUFFIXES)

    def city(self) -> str:
        r = self.rng
        return r.choice(PROVINCE_CITIES[r.choice(sorted(PROVINCE_CITIES))])

    def date(self, person: bool = True) -> str:
        r = self.rng
        if person:
            year = r.randint(1920, 2005)
        else:  # schools and old firms go back further: 复旦大学创建于1905年
            year = r.randint(1880, 1949) if r.random() < 0.25 else r.randint(1950, 2023)
        month, day = r.randint(1, 12), r.randint(1, 28)
        style = r.random()
        if style < 0.40:
            return f"{year}年{month}月{day}日"
        if style < 0.62:
            return f"{year}年{month}月"
        if style < 0.80:
            return f"{year}年"
        if style < 0.86:
            return f"{year}-{month:02d}-{day:02d}"
        if style < 0.91:
            return f"{year}年{month:02d}月{day:02d}日"
        if style < 0.95:
            # Everyday forms: 5月3号, 1990.5.3, 一九九〇年.
            return f"{year}年{month}月{day}号"
        if style < 0.96:
            return f"{year}.{month}.{day}"
        if style < 0.97:
            return f"{year}.{month:02d}"
        if style < 0.98:
            # Two-digit years, as people say them: 89年, 89年5月.
            return f"{year % 100:02d}年" + (f"{month}月" if r.random() < 0.4 else "")
        chinese = "".join("〇一二三四五六七八九"[int(d)] for d in str(year)) + "年"
        if r.random() < 0.3:
            chinese += (
                "一二三四五六七八九十"[month - 1] if month <= 10 else "十" + "一二"[month - 11]
            )
            chinese += "月"
        return chinese

    def country(self) -> str:
        r = self.rng
        if r.random() < 0.3:
            return "中国"
        return r.choice(COUNTRY_CAPITALS)[0]

    def school(self) -> str:
        r = self.rng

        def make() -> str:
            x = r.random()
            if x < 0.3:
                return r.choice(REAL_SCHOOLS)
            if x < 0.42:
                return r.choice(SCHOOL_SHORT)
            if x < 0.52:
                return r.choice(SCHOOL_SHORT_PATTERNS).format(c=self.city(), t=self.translit(2, 4))
            prov = r.choice(sorted(PROVINCE_CITIES))
            return r.choice(SCHOOL_PATTERNS).format(c=self.city(), c2=self.city(), p=prov)

        return self._draw(make)

    def publisher(self) -> str:
        r = self.rng

        def make() -> str:
            if r.random() < 0.4:
                return r.choice(PUBLISHERS_FIXED)
            prov = r.choice(sorted(PROVINCE_CITIES))
            return r.choice(PUBLISHER_PATTERNS).format(p=prov, c=self.city())

        return self._draw(make)

    def company(self) -> str:
        r = self.rng

        def make() -> str:
            style = r.random()
            if style < 0.12:
                # Bare brand names, as people write them: 腾讯, 阿里巴巴, 华为.
                return self.fake.company_prefix()
            if style < 0.22:
                return self.coined(self.chars if style < 0.17 else self.wide)
            if style < 0.27:
                return self.translit(2, 4)
            if style < 0.45:
                return self.fake.company()
            if style < 0.55:
                stem = self.fake.company_prefix()
            else:
                stem = "".join(r.choice(COMPANY_CHARS) for _ in range(r.choice((2, 2, 3, 4))))
            if r.random() < 0.15:
                stem = self.city() + stem
            return stem + r.choice(COMPANY_SUFFIXES)

        return self._draw(make)

    def title(self, kind: str) -> str:
        r = self.rng
        patterns = TITLE_PATTERNS + {
            "film": FILM_EXTRA,
            "song": SONG_EXTRA,
            "album": ALBUM_EXTRA,
        }.get(kind, ())

        def make() -> str:
            x = r.random()
            if x < 0.2:
                # Titles of ordinary characters, without a cue of their own: 活着, 晴天.
                return self.coined(self.chars if x < 0.1 else self.wide)
            a, b = r.sample(TITLE_NOUNS, 2)
            return r.choice(patterns).format(
                a=a,
                b=b,
                m=r.choice(TITLE_MODIFIERS),
                c=self.city(),
                n=r.choice("一二三四五六七八九十"),
                e=r.choice(ENGLISH_TITLES),
                y=r.choice(("1997", "2046", "1988", "2008", "十八岁", "三十岁")),
            )

        return self._draw(make)

    def ethnicity(self) -> str:
        return self.rng.choice(ETHNICITIES)

    # ---- rendering --------------------------------------------------------------------------
    def _entity(self, kind: str, subject: Person | None) -> tuple[str, Person | None]:
        """Draw an entity of a schema type; people come back with their gender."""
        if kind == "人物":
            p = self.person()
            return p.name, p
        makers: dict[str, Callable[[], str]] = {
            "地点": self.place,
            "Date": lambda: self.date(person=True),
            "国家": self.country,
            "学校": self.school,
            "出版社": self.publisher,
            "音乐专辑": lambda: self.title("album"),
            "文本": self.ethnicity,
        }
        return makers[kind](), None

    def _object(
        self, predicate: str, subject: Person | None, subject_text: str = ""
    ) -> tuple[str, Person | None]:
        if predicate == "首都":
            return dict(COUNTRY_CAPITALS)[subject_text], None
        if predicate in ("妻子", "母亲"):
            p = self.person(male=False)
            return p.name, p
        family = _surname(subject_text)
        if predicate == "父亲" and family and self.rng.random() < 0.7:
            # A child mostly bears the father's surname: 陈静的父亲陈国华.
            p = self.person(male=True, family=family)
            return p.name, p
        if predicate in ("丈夫", "父亲"):
            p = self.person(male=True)
            return p.name, p
        if predicate == "成立日期":
            return self.date(person=False), None
        return self._entity(dict((p, o) for p, _, o in SCHEMA)[predicate], subject)

    def _decorations(self, subject: Person | None) -> dict[str, str]:
        r = self.rng
        male = subject.male if subject else True
        return {
            "他": subject.pronoun if subject else "它",
            "子女": "儿子" if male else "女儿",
            "occ": r.choice(OCCUPATIONS),
            "year": str(r.randint(1950, 2022)),
            "role": r.choice(ROLES),
            "ind": r.choice(INDUSTRIES),
            "dept": r.choice(DEPTS),
            "n": str(r.randint(2, 60)),
            "city": self.city(),
            "btype": r.choice(BOOK_TYPES),
        }

    def _join(self, names: list[str]) -> str:
        if len(names) == 1:
            return names[0]
        r = self.rng.random()
        if r < 0.5:
            return "、".join(names)
        if r < 0.8:
            return "、".join(names[:-1]) + "和" + names[-1]
        if r < 0.92:
            return "、".join(names[:-1]) + "与" + names[-1]
        return "、".join(names[:-1]) + self.rng.choice(("及", "以及")) + names[-1]

    def _words(self) -> str:
        """Two to eight common characters of no template: words the model must not lean on."""
        return "".join(self.rng.choice(self.wide) for _ in range(self.rng.randint(2, 8)))

    def _tail(self) -> str:
        """Any words after a fact (``写的是`` and words of no list): the fact ends where its name
        ends, not where a known continuation begins."""
        return self.rng.choice(TAIL_LEADS) + self._words()

    def _remark(self) -> str:
        """What a person named as an object is or does, no fact of the schema: 是一位唐卡画师, 曾任...,
        在拉萨开了一家茶馆."""
        r = self.rng
        template = r.choice(PERSON_REMARKS)
        city = self.city()
        if "{city}" in template:
            self._mentions.append((city, "地点"))
        return self._fill(
            template, {"occ": r.choice(OCCUPATIONS), "x": self._words(), "city": city}
        )

    def clause(
        self,
        predicate: str,
        subject: str,
        subject_person: Person | None = None,
        objects: list[str] | None = None,
        template: str | None = None,
    ) -> _Clause:
        """One phrasing of ``predicate`` about ``subject`` (objects drawn unless given)."""
        r = self.rng
        template = template or r.choice(TEMPLATES[predicate])
        many = "{os}" in template
        if objects is None:
            count = 1
            if many:
                count = r.choice((1, 1, 2, 2, 3)) if predicate == "主演" else r.choice((1, 1, 1, 2))
            objects = []
            while len(objects) < count:
                name, _ = self._object(predicate, subject_person, subject)
                if name != subject and name not in objects:
                    objects.append(name)
        values = self._decorations(subject_person)
        values["~"] = self.rng.choice(CONTINUATIONS[dict((p, t) for p, t, _ in SCHEMA)[predicate]])
        if r.random() < 0.35:
            values["~"] = self._tail()
        values["s"] = subject
        values["o"] = objects[0]
        values["os"] = self._join(objects)
        used = template + (values["~"] if "{~}" in template else "")
        if "{city}" in used:
            self._mentions.append((values["city"], "地点"))
        if "{year}年" in used:
            self._mentions.append((values["year"] + "年", "日期"))
        values["~"] = _SLOT.sub(lambda m: values[m.group(1)], values["~"])
        text = _SLOT.sub(lambda m: values[m.group(1)], template)
        triples: list[tuple[str, str, str]] = []
        for obj in objects if many else objects[:1]:
            triples.append((subject, predicate, obj))
            if predicate in SPOUSE_INVERSE:
                triples.append((obj, SPOUSE_INVERSE[predicate], subject))
        if "{year}年" in template and predicate in _YEAR_FACTS:
            # 张三1962年生在济南 states the birth year too; 马化腾于1998年创办了腾讯, the founding year.
            triples.append((subject, _YEAR_FACTS[predicate], values["year"] + "年"))
        elided = None
        leads_verb = template.startswith("{s}") and template[3:4] not in (
            "的",
            "，",
            "、",
            "（",
            "和",
            "与",
            "{",
        )
        if leads_verb and text.startswith(subject) and r.random() < 0.06:
            # 北京大学则创办于1898年, 吴彦祖其实是美国国籍: an adverb between subject and verb.
            text = subject + r.choice(SUBJECT_ADVERBS) + text[len(subject) :]
        if template.startswith("{s}") and template[3:4] not in (
            "的",
            "，",
            "、",
            "（",
            "是",
            "和",
            "与",
        ):
            elided = _SLOT.sub(lambda m: values[m.group(1)], template[3:])
        for lead in ("{s}的", "《{s}》的"):
            # 华为总部位于深圳，创始人是任正非: the owner of a noun is left out after the first clause.
            if template.startswith(lead) and template[len(lead) : len(lead) + 1] != "{":
                elided = _SLOT.sub(lambda m: values[m.group(1)], template[len(lead) :])
        return _Clause(text, triples, elided)

    # ---- sentence shapes --------------------------------------------------------------------
    def _single(self) -> Record:
        predicate = self.rng.choice(PREDICATES)
        subject, person = self._subject_for(predicate)
        c = self.clause(predicate, subject, person)
        return Record(c.text, c.triples)

    def _subject_for(self, predicate: str) -> tuple[str, Person | None]:
        kind = dict((p, s) for p, s, _ in SCHEMA)[predicate]
        if kind == "人物":
            male = {"妻子": True, "丈夫": False}.get(predicate)
            if male is None and self.rng.random() < 0.04:
                # 我外婆是1936年在湖南湘潭出生的: kin, not a name, as the subject.
                kin = self._draw(lambda: self.rng.choice(KIN_SUBJECTS))
                if predicate not in ("父亲", "母亲") or kin[1:] not in ("爸", "妈", "父亲", "母亲"):
                    return kin, Person(kin, kin in KIN_MALE)
            p = self.person(male)
            return p.name, p
        if kind in ("图书作品", "书籍"):
            return self.title("book"), None
        if kind == "影视作品":
            return self.title("film"), None
        if kind == "歌曲":
            return self.title("song"), None
        if kind == "机构" and self.rng.random() < 0.35:
            # Schools are founded too: 复旦大学创建于1905年.
            return self.school(), None
        if kind in ("企业", "机构"):
            return self.company(), None
        if kind == "国家":
            return self.rng.choice(COUNTRY_CAPITALS)[0], None
        raise AssertionError(kind)

    TOPICS: ClassVar[dict[str, tuple[str, ...]]] = {
        "person": (
            "出生地",
            "出生日期",
            "国籍",
            "毕业院校",
            "妻子",
            "丈夫",
            "父亲",
            "母亲",
            "祖籍",
            "民族",
        ),
        "book": ("作者", "出版社"),
        "film": ("导演", "主演", "编剧"),
        "song": ("歌手", "作词", "作曲", "所属专辑"),
        "company": ("创始人", "董事长", "总部地点", "成立日期"),
    }

    def _chain(
        self, topic: str, subject: str | None = None, person: Person | None = None, lead: str = ""
    ) -> tuple[str, list[tuple[str, str, str]], Person | None]:
        """Several facts about one subject, one sentence; returns the last person object named."""
        r = self.rng
        options = list(self.TOPICS[topic])
        if topic == "person":
            if person is None:
                person = self.person()
            subject = person.name
            options.remove("丈夫" if person.male else "妻子")
        else:
            first = options[0]
            if subject is None:
                subject, _ = self._subject_for(first)
        assert subject is not None
        k = r.randint(2, min(4, len(options)))
        chosen = r.sample(options, k)
        parts: list[str] = []
        triples: list[tuple[str, str, str]] = []
        last_person: Person | None = None
        seen_objects: set[str] = {subject}
        for i, predicate in enumerate(chosen):
            c = self.clause(predicate, subject, person)
            if any(t[2] in seen_objects for t in c.triples if t[0] == subject):
                continue
            if {t[:2] for t in c.triples} & {t[:2] for t in triples}:
                continue  # 于1995年创立，成立于1983年: a year already stated by another clause
            seen_objects.update(t[2] for t in c.triples)
            if (
                parts
                and predicate in _NOUN_LEAD_PREDICATES
                and len(c.triples) == 1 + (predicate in SPOUSE_INVERSE)
                and r.random() < 0.25
            ):
                # The relation's noun, its object and whatever is said of that person (no fact):
                # 钱学森...，父亲钱均夫是教育家; 格力电器总部设在珠海，董事长董明珠常常....
                nouns = [n for n in REL_NOUNS[predicate] if n not in ("男主角", "女主角")]
                obj = next(o for _, p, o in c.triples if p == predicate)
                text = r.choice(nouns) + obj + (self._remark() if r.random() < 0.7 else "")
            elif i == 0 or not parts:
                text = c.text
            elif c.elided is not None and r.random() < 0.7:
                text = c.elided
            elif person is not None and _pronounable(c.text, subject) and r.random() < 0.6:
                text = person.pronoun + c.text[len(subject) :]
            elif (
                topic in WORK_PRONOUNS and c.text.startswith(f"《{subject}》") and r.random() < 0.6
            ):
                text = r.choice(WORK_PRONOUNS[topic]) + c.text[len(subject) + 2 :]
            elif topic == "company" and c.text.startswith(subject) and r.random() < 0.5:
                text = r.choice(WORK_PRONOUNS[topic]) + c.text[len(subject) :]
            else:
                text = c.text
            if parts and r.random() < 0.08:
                text = r.choice(ASIDES) + "，" + text
            parts.append(text)
            triples.extend(c.triples)
            if predicate in (
                "导演",
                "主演",
                "编剧",
                "作者",
                "歌手",
                "创始人",
                "董事长",
                "妻子",
                "丈夫",
            ):
                # The last person the clause names (not the year of 于1998年创办).
                obj = [o for _, p, o in c.triples if p == predicate][-1]
                last_person = Person(obj, self.genders.get(obj, True))
        sep = "，" if r.random() < 0.8 else "；"
        return lead + sep.join(parts) + "。", triples, last_person

    def _hop(self) -> Record:
        """A fact about a work or company, then facts about the person it names."""
        r = self.rng
        topic = r.choice(("book", "film", "song", "company", "film", "song"))
        text, triples, person = self._chain(topic)
        if person is None:
            return Record(text, triples)
        options = [
            "出生地",
            "出生日期",
            "毕业院校",
            "国籍",
            "祖籍",
            "民族",
            "丈夫" if not person.male else "妻子",
        ]
        predicate = r.choice(options)
        c = self.clause(predicate, person.name, person)
        if c.triples[0][2] in text:
            return Record(text, triples)
        if _pronounable(c.text, person.name) and r.random() < 0.5:
            follow = person.pronoun + c.text[len(person.name) :]
        else:
            follow = c.text
        return Record(text[:-1] + r.choice(("。", "，")) + follow + "。", triples + c.triples)

    def _bio_header(self) -> Record:
        """Encyclopedia style: 张三，男，汉族，1962年5月生，山东济南人，毕业于山东大学。"""
        r = self.rng
        p = self.person()
        parts = [p.name, "男" if p.male else "女"]
        triples: list[tuple[str, str, str]] = []
        if r.random() < 0.8:
            eth = self.ethnicity()
            parts.append(eth)
            triples.append((p.name, "民族", eth))
        if r.random() < 0.8:
            d = self.date()
            parts.append(d + r.choice(("生", "出生", "生人")))
            triples.append((p.name, "出生日期", d))
        if r.random() < 0.7:
            place = self.place()
            if r.random() < 0.6:
                parts.append(place + "人")
                triples.append((p.name, "出生地", place))
            else:
                parts.append("祖籍" + place)
                triples.append((p.name, "祖籍", place))
        if r.random() < 0.6:
            sch = self.school()
            parts.append("毕业于" + sch if r.random() < 0.7 else sch + "毕业")
            triples.append((p.name, "毕业院校", sch))
        if r.random() < 0.35:
            com = self.company()
            parts.append(r.choice(("现任", "曾任")) + com + "董事长")
            triples.append((com, "董事长", p.name))
        else:
            parts.append(r.choice(OCCUPATIONS))
        return Record("，".join(parts) + "。", triples)

    # ---- everyday shapes (issue 23) ---------------------------------------------------------
    def _objects(self, predicate: str, subject: str, count: int, taken: set[str]) -> list[str]:
        """``count`` distinct objects of ``predicate`` for ``subject``, none of them in ``taken``."""
        objects: list[str] = []
        for _ in range(50):
            if len(objects) == count:
                break
            name, _ = self._object(predicate, None, subject)
            if name not in taken and name not in objects and name != subject:
                objects.append(name)
        taken.update(objects)
        return objects

    def _count(self, predicate: str) -> int:
        r = self.rng
        return r.choice((1, 2, 2, 3)) if predicate == "主演" else r.choice((1, 1, 1, 2))

    def _fill(self, template: str, values: dict[str, str]) -> str:
        return _SLOT.sub(lambda m: values[m.group(1)], template)

    def _credits(self) -> Record:
        """Several credits of one work: 《S》由A执导，B、C主演 / 《S》的导演是A，主演B和C /
        A执导、B主演的《S》; sometimes one person in several roles (由A自编自导)."""
        r = self.rng
        topic = r.choice(("film", "film", "song", "song", "book"))
        options = list(CREDIT_TOPICS[topic])
        subject, _ = self._subject_for(options[0])
        form = r.randrange(3)
        taken = {subject}
        segments: list[str] = []
        triples: list[tuple[str, str, str]] = []
        merged = [m for m in MERGED_ROLES if set(m[0]) <= set(options)]
        merged_lead = bool(merged) and r.random() < 0.2
        if merged_lead:
            roles, phrasings = r.choice(merged)
            person = self.person().name
            taken.add(person)
            segments.append(r.choice(phrasings).format(o=person))
            triples.extend((subject, p, person) for p in roles)
            options = [p for p in options if p not in roles]
            chosen = r.sample(options, r.randint(0, min(1, len(options))))
        else:
            chosen = r.sample(options, r.randint(2, len(options)))
        if form == 2 and "所属专辑" in chosen:
            chosen.remove("所属专辑")
        if "所属专辑" in chosen:  # the album comes last: 由A作词、B作曲，收录于专辑《X》
            chosen.remove("所属专辑")
            chosen.append("所属专辑")
        off_schema = ""
        if form == 1 and r.random() < 0.3:  # 《S》的出品人是A，导演B: a role beside the schema's
            other = self.person().name
            if other not in taken:
                taken.add(other)
                self._mentions.append((other, "人物"))
                off_schema = r.choice(OFF_SCHEMA_CREDITS[topic]).format(o=other)
        for predicate in chosen:
            phrasings = CREDITS[predicate][form]
            if form == 1 and not segments:
                phrasings = tuple(t for t in phrasings if "是" in t or "为" in t)
            template = r.choice(phrasings)
            objects = self._objects(predicate, subject, self._count(predicate), taken)
            if not objects:
                continue
            many = "{os}" in template
            values = {"os": self._join(objects), "o": objects[0]}
            segments.append(self._fill(template, values))
            triples.extend((subject, predicate, o) for o in (objects if many else objects[:1]))
        if len(segments) < 2 and len(triples) < 2:
            return self._single_record()
        kind = r.choice(WORK_KINDS[topic])
        title = f"{kind}《{subject}》"
        listed = any("、" in s or "和" in s for s in segments)
        album = segments.pop() if segments[-1].startswith("收录") else ""
        if not segments:  # only the album was left (its credits could not be drawn)
            return self._single_record()
        if off_schema:
            segments.insert(r.randrange(len(segments) + 1), off_schema)
            if not any("是" in x or "为" in x for x in segments[:1]):
                segments.insert(0, segments.pop(segments.index(off_schema)))
        if form == 0:
            sep = "，" if listed or topic != "song" else r.choice(("，", "、"))
            rest = [s if r.random() < 0.7 else "由" + s for s in segments[1:]]
            text = title + "由" + sep.join([segments[0], *rest])
        elif form == 1 and not merged_lead:
            text = title + "的" + "，".join(segments)
        elif form == 1:  # a merged role leads: 《S》由A自编自导，主演是B
            text = title + "由" + "，".join(segments)
        else:
            sep = "，" if listed else "、"
            lead = "由" if r.random() < 0.25 else ""  # 由王小帅执导、王景春和咏梅主演的《地久天长》
            text = lead + sep.join(segments) + "的" + title + r.choice(CONTINUATIONS["影视作品"])
        if album:
            text += "，" + album
        if topic == "film" and r.random() < 0.25:
            author = self.person().name
            if author not in taken:
                novel = self.title("book")
                if novel not in taken and r.random() < 0.6:
                    text += "，" + r.choice(ADAPTED_FROM).format(a=author, b=novel)
                    triples.append((novel, "作者", author))
                else:
                    text += "，" + r.choice(ADAPTED_SAME).format(a=author)
                    self._mentions.append((author, "人物"))
        return Record(text + "。", triples)

    def _single_record(self) -> Record:
        rec = self._single()
        rec.text += "。"
        return rec

    def _render_subjects(self, predicate: str, subjects: list[str]) -> str:
        kind = dict((p, s) for p, s, _ in SCHEMA)[predicate]
        if kind in ("图书作品", "书籍", "影视作品", "歌曲"):
            return self._join([f"《{s}》" for s in subjects])
        return self._join(subjects)

    def _shared(self) -> Record:
        """Several subjects, one object: 《A》和《B》都是X写的; 张三、李四都毕业于北京大学."""
        r = self.rng
        predicate = r.choice(sorted(SHARED_OBJECT))
        n = r.choice((2, 2, 3))
        subjects: list[str] = []
        for _ in range(10):
            if len(subjects) == n:
                break
            s, _ = self._subject_for(predicate)
            if s not in subjects:
                subjects.append(s)
        obj = self._objects(predicate, subjects[0], 1, set(subjects))
        if not obj:
            return self._single_record()
        values = {"ss": self._titles(predicate, subjects), "o": obj[0]}
        text = self._fill(r.choice(SHARED_OBJECT[predicate]), values)
        return Record(text + "。", [(s, predicate, obj[0]) for s in subjects])

    def _respectively(self) -> Record:
        """Subjects and objects paired in order: 意大利、西班牙的首都分别是罗马、马德里."""
        r = self.rng
        predicate = r.choice(sorted(RESPECTIVELY))
        n = r.choice((2, 2, 3))
        subjects: list[str] = []
        if predicate == "首都":
            subjects = [c for c, _ in r.sample(COUNTRY_CAPITALS, n)]
        else:
            for _ in range(10):
                if len(subjects) == n:
                    break
                s, _ = self._subject_for(predicate)
                if s not in subjects:
                    subjects.append(s)
        taken = set(subjects)
        objects = [self._objects(predicate, s, 1, taken) for s in subjects]
        if not all(objects) or len(subjects) < 2:
            return self._single_record()
        pairs = [(s, o[0]) for s, o in zip(subjects, objects, strict=True)]
        style = r.random()

        def join(names: list[str]) -> str:
            if style < 0.5:
                return "、".join(names)
            return "、".join(names[:-1]) + "和" + names[-1]

        kind = dict((p, s) for p, s, _ in SCHEMA)[predicate]
        titled = kind in ("图书作品", "书籍", "影视作品", "歌曲")
        values = {
            "ss": join([f"《{s}》" if titled else s for s in subjects]),
            "os": join([o for _, o in pairs]),
        }
        text = self._fill(r.choice(RESPECTIVELY[predicate]), values)
        return Record(text + "。", [(s, predicate, o) for s, o in pairs])

    def _parallel(self) -> Record:
        """The same predicate twice, about different subjects: A的首都是B，C的首都是D."""
        r = self.rng
        # Capitals come in pairs most often (A的首都是B，C的首都是D).
        predicate = "首都" if r.random() < 0.15 else r.choice(PREDICATES)
        # Phrasings without a comma or bracket of their own, so the clauses stay apart.
        phrasings = [t for t in TEMPLATES[predicate] if not any(c in t for c in "，（；")]
        template = r.choice(phrasings)
        parts: list[str] = []
        triples: list[tuple[str, str, str]] = []
        names: set[str] = set()
        for _ in range(r.choice((2, 2, 3))):
            subject, person = self._subject_for(predicate)
            same = template if r.random() < 0.8 else r.choice(phrasings)
            c = self.clause(predicate, subject, person, template=same)
            found = {x for t in c.triples for x in (t[0], t[2])}
            if found & names or any(a in b or b in a for a in found for b in names):
                continue
            names |= found
            parts.append(c.text)
            triples.extend(c.triples)
        if len(parts) < 2:
            return self._single_record()
        sep = r.choice(("，", "，", "；", "，而" if len(parts) == 2 else "，"))
        return Record(sep.join(parts) + "。", triples)

    def _apposition(self) -> Record:
        """Side facts set off by commas or brackets: 张三，山东济南人，1962年生，毕业于北京大学;
        美国导演张三执导的《S》; 《S》的作者是张三，浙江绍兴人."""
        r = self.rng
        person = self.person()
        name = person.name
        x = r.random()
        if x < 0.4:
            # A trade (and a nationality or ethnicity) before a credit.
            predicate = r.choice(sorted(CREDIT_NOUNS))
            topic = {"导演": "film", "编剧": "film", "主演": "film", "作者": "book"}.get(
                predicate, "song"
            )
            subject, _ = self._subject_for(predicate)
            triples = [(subject, predicate, name)]
            lead = ""
            y = r.random()
            if y < 0.4:
                lead = self.country()
                triples.append((name, "国籍", lead))
            elif y < 0.55:
                lead = self.ethnicity()
                triples.append((name, "民族", lead))
            noun = r.choice(CREDIT_NOUNS[predicate])
            # Not the trade twice (导演A导演的): 导演A执导的.
            verb = r.choice([v for v in CREDITS[predicate][2] if v[4:] not in noun])
            kind = r.choice(WORK_KINDS[topic])
            tail = r.choice(CONTINUATIONS["影视作品"])
            text = lead + noun + verb.format(os=name) + f"的{kind}《{subject}》" + tail
            return Record(text + "。", triples)
        sides = r.sample(sorted(SIDE_FACTS), r.choice((1, 1, 2, 3)))
        side_texts: list[str] = []
        triples = []
        for predicate in sides:
            obj = self._objects(predicate, name, 1, {name, *(t[2] for t in triples)})
            if not obj:
                continue
            side_texts.append(r.choice(SIDE_FACTS[predicate]).format(o=obj[0]))
            triples.append((name, predicate, obj[0]))
        if x < 0.75:
            # 张三（1962年5月3日－），...; then a fact about the person.
            if r.random() < 0.3 and "出生日期" not in sides:
                d = self.date()
                head = f"{name}（{d}－）"
                triples.append((name, "出生日期", d))
            else:
                head = name
            mains = [p for p in self.TOPICS["person"] if p not in sides and p != "丈夫"]
            if not person.male:
                mains = [p if p != "妻子" else "丈夫" for p in mains]
            named = {o for _, _, o in triples}
            for _ in range(5):
                c = self.clause(r.choice(mains), name, person)
                if any(t[2] in named or t[0] in named for t in c.triples):
                    continue
                if {t[:2] for t in c.triples} & {t[:2] for t in triples}:
                    continue  # 张三（1962年－），1971年生: one birth date
                if c.elided is not None:
                    rest = c.elided
                elif _pronounable(c.text, name):
                    rest = person.pronoun + c.text[len(name) :]
                else:
                    continue
                text = head + "，" + "，".join([*side_texts, rest]) + "。"
                return Record(text, triples + c.triples)
            return Record(head + "，" + "，".join(side_texts) + "。", triples)
        # 《S》的作者是张三，浙江绍兴人.
        predicate = r.choice(("导演", "作者", "歌手", "编剧", "作词", "作曲", "主演"))
        subject, _ = self._subject_for(predicate)
        ending = [t for t in TEMPLATES[predicate] if t.endswith("{os}")]
        c = self.clause(predicate, subject, None, objects=[name], template=r.choice(ending))
        if not side_texts:
            return Record(c.text + "。", c.triples)
        return Record(c.text + "，" + "，".join(side_texts) + "。", c.triples + triples)

    def _parents(self) -> Record:
        """Father and mother in one sentence: 陈静的父亲是陈国华，母亲是李秀兰."""
        r = self.rng
        child = self.person()
        family = _surname(child.name)
        if family and r.random() < 0.8:
            father = self.person(male=True, family=family).name
        else:
            father = self.person(male=True).name
        mother = self.person(male=False).name
        if len({child.name, father, mother}) < 3:
            return self._single_record()
        values = self._decorations(child)
        values.update(s=child.name, f=father, m=mother, occ2=r.choice(OCCUPATIONS))
        values["~"] = r.choice(CONTINUATIONS["人物"])
        text = self._fill(r.choice(PARENTS), values)
        return Record(text + "。", [(child.name, "父亲", father), (child.name, "母亲", mother)])

    def _born(self) -> Record:
        """Birth date and place in one phrase (莫言1955年出生于山东高密), often with a fact after it."""
        r = self.rng
        person = self.person()
        d, p = self.date(), self.place()
        text = self._fill(r.choice(BORN), {"s": person.name, "d": d, "p": p})
        triples = [(person.name, "出生日期", d), (person.name, "出生地", p)]
        if r.random() < 0.5:
            predicate = r.choice(("毕业院校", "父亲", "母亲", "民族", "祖籍", "国籍"))
            c = self.clause(predicate, person.name, person)
            if c.triples[0][2] not in text and not any(c.triples[0][2] in x for x in (d, p)):
                rest = c.elided if c.elided is not None and r.random() < 0.6 else None
                if rest is None and _pronounable(c.text, person.name):
                    rest = person.pronoun + c.text[len(person.name) :]
                if rest is not None:
                    text += "，" + rest
                    triples += c.triples
        return Record(text + "。", triples)

    def _founded(self) -> Record:
        """A company's founders and founding date in one phrase: 马化腾于1998年在深圳创办了腾讯."""
        r = self.rng
        company = self.company()
        founders = self._objects("创始人", company, r.choice((1, 1, 1, 2, 3)), {company})
        if not founders:
            return self._single_record()
        d = self.date(person=False)
        city = self.city()
        self._mentions.append((city, "地点"))
        values = {"c": company, "f": self._join(founders), "d": d, "city": city}
        text = self._fill(r.choice(FOUNDED), values)
        triples = [(company, "创始人", f) for f in founders] + [(company, "成立日期", d)]
        return Record(text + "。", triples)

    def _fields(self) -> Record:
        """Form or résumé fields: 姓名：欧阳婧　民族：回族　出生年月：1986.04."""
        r = self.rng
        topic = r.choice(("person", "person", "film", "song", "book", "company"))
        fields = FIELDS[topic]
        subject_field, rest = fields[0], list(fields[1:])
        if topic == "person":
            person = self.person()
            subject = person.name
            rest = [f for f in rest if f[1] != "spouse" or r.random() < 0.5]
        else:
            person = None
            first = {"film": "导演", "song": "歌手", "book": "作者", "company": "创始人"}[topic]
            subject = self.company() if topic == "company" else self._subject_for(first)[0]
        chosen = sorted(r.sample(range(len(rest)), r.randint(2, len(rest))))
        sep = r.choice(FIELD_SEPARATORS)
        colon = r.choice(FIELD_COLONS)
        parts = [r.choice(subject_field[0]) + colon + subject]
        triples: list[tuple[str, str, str]] = []
        taken = {subject}
        for i in chosen:
            keys, predicate = rest[i]
            if predicate == "spouse":
                predicate = "丈夫" if person is not None and not person.male else "妻子"
                keys = ("配偶", predicate)
            count = self._count(predicate) if predicate in ("主演", "编剧", "创始人") else 1
            objects = self._objects(predicate, subject, count, taken)
            if not objects:
                continue
            parts.append(r.choice(keys) + colon + "、".join(objects))
            for o in objects:
                triples.append((subject, predicate, o))
                if predicate in SPOUSE_INVERSE:
                    triples.append((o, SPOUSE_INVERSE[predicate], subject))
        if topic == "person" and r.random() < 0.5:
            parts.insert(1, "性别" + colon + ("男" if person and person.male else "女"))
        text = r.choice(FIELD_HEADERS) + sep.join(parts)
        return Record(text, triples)

    def _mention(self, subject: str, predicate: str, obj: str) -> None:
        """Record the typed names of a triple the text names but does not state (a denied fact)."""
        self._mentions.extend(triple_entities([(subject, predicate, obj)]))

    def _correction(self) -> Record:
        """A wrong object denied and the right one given: 《子夜》不是巴金写的，而是茅盾写的;
        很多人以为土耳其的首都是伊斯坦布尔，其实是安卡拉. Only the right one is a fact; a denial
        alone (《子夜》不是巴金写的) states nothing."""
        r = self.rng
        predicate = r.choice(sorted({*REL_NOUNS, *REL_VERBS, *PERSON_IS}))
        forms = [
            form
            for form, table in (("noun", REL_NOUNS), ("verb", REL_VERBS), ("is", PERSON_IS))
            if predicate in table
        ]
        form = r.choice(forms)
        subject, person = self._subject_for(predicate)
        if predicate == "首都":
            right = dict(COUNTRY_CAPITALS)[subject]
            others = [c for _, c in COUNTRY_CAPITALS if c != right] + list(FOREIGN_CITIES)
            objects = [right, *r.sample(others, 2)]
        else:
            objects = self._objects(predicate, subject, 3, {subject})
        if len(objects) < 3 or any(a in b for a in objects for b in objects if a != b):
            return self._single_record()
        right, wrong, wrong2 = objects
        values = {
            "s": self._render_subjects(predicate, [subject]),
            "o": right,
            "w": wrong,
            "w2": wrong2,
            "他": person.pronoun if person else "它",
        }
        values["r"] = r.choice(REL_NOUNS.get(predicate, ("",)))
        values["v"] = r.choice(REL_VERBS.get(predicate, ("",)))
        values["x"] = r.choice(PERSON_IS.get(predicate, ("{o}",)))[3:]
        if r.random() < 0.25:
            text = self._fill(r.choice(DENIALS[form]), values)
            self._mention(subject, predicate, wrong)
            return Record(text if text.endswith("？") else text + "。", [])
        template = r.choice(CORRECTIONS[form])
        for w in (wrong, wrong2) if "{w2}" in template else (wrong,):
            self._mention(subject, predicate, w)
        triples = [(subject, predicate, right)]
        if predicate in SPOUSE_INVERSE:
            triples.append((right, SPOUSE_INVERSE[predicate], subject))
        return Record(self._fill(template, values) + "。", triples)

    def _object_facts(self) -> Record:
        """Facts about the object of a relation, right after its noun: 冯小刚的妻子徐帆是湖北武汉人，
        毕业于中央戏剧学院; 亚马逊创始人贝索斯1964年出生于美国; 泰国首都曼谷的夜市很热闹."""
        r = self.rng
        predicate = r.choice(_OBJECT_FACT_PREDICATES)
        subject, subject_person = self._subject_for(predicate)
        rendered = self._render_subjects(predicate, [subject])
        lead = r.choice(OBJECT_LEADS)
        if predicate == "首都":
            capital = dict(COUNTRY_CAPITALS)[subject]
            words = ["".join(r.choice(self.wide) for _ in range(r.randint(2, 4))) for _ in "xy"]
            city, template = self.city(), r.choice(CAPITAL_TAILS)
            if "{c}" in template:
                self._mentions.append((city, "地点"))
            tail = self._fill(
                template, {"n": str(r.randint(2, 5)), "c": city, "x": words[0], "y": words[1]}
            )
            text = self._fill(lead, {"s": rendered, "r": "首都", "o": capital}) + tail
            return Record(text + "。", [(subject, "首都", capital)])
        name, person = self._object(predicate, subject_person, subject)
        if person is None or name == subject:
            return self._single_record()
        noun = r.choice(REL_NOUNS[predicate])
        if noun in ("男主角", "女主角"):
            noun = "男主角" if person.male else "女主角"
        text = self._fill(lead, {"s": rendered, "r": noun, "o": name})
        triples = [(subject, predicate, name)]
        if predicate in SPOUSE_INVERSE:
            triples.append((name, SPOUSE_INVERSE[predicate], subject))
        parts: list[str] = []
        if r.random() < 0.45:
            parts.append(self._remark())
            if r.random() < 0.5:
                # Only the remark: 次仁卓玛的母亲央金是一位唐卡画师.
                return Record(text + parts[0] + "。", triples)
        taken = {subject, name}
        facts = ("出生地", "出生日期", "毕业院校", "民族", "祖籍", "国籍", "父亲", "母亲", "born")
        for fact in r.sample(facts, r.choice((1, 1, 2))):
            if fact == "born":
                born = [t for t in BORN if t.startswith("{s}{d}")]
                d, p = self.date(), self.place()
                full = self._fill(r.choice(born), {"s": name, "d": d, "p": p})
                found = [(name, "出生日期", d), (name, "出生地", p)]
                elided = full[len(name) :]
            else:
                c = self.clause(fact, name, person)
                full, found, elided = c.text, c.triples, c.elided or ""
            if any(t[2] in taken or any(t[2] in x for x in taken) for t in found):
                continue
            if {p for s, p, _ in found} & {p for s, p, _ in triples if s == name}:
                continue
            if not parts:
                # The first fact reads straight on from the name: 徐帆是湖北武汉人.
                if not _pronounable(full, name) or full[len(name)] == "的":
                    continue
                parts.append(full[len(name) :])
            elif elided and r.random() < 0.6:
                parts.append(elided)
            elif _pronounable(full, name):
                parts.append(person.pronoun + full[len(name) :])
            else:
                continue
            taken.update(t[2] for t in found)
            triples.extend(found)
        if len(triples) < 2 + (predicate in SPOUSE_INVERSE):
            return self._single_record()
        return Record(text + "，".join(parts) + "。", triples)

    def _titles(self, predicate: str, subjects: list[str]) -> str:
        """Titles listed, or side by side as people type them (《骆驼祥子》《四世同堂》《茶馆》)."""
        kind = dict((p, s) for p, s, _ in SCHEMA)[predicate]
        titled = kind in ("图书作品", "书籍", "影视作品", "歌曲")
        if titled and len(subjects) > 1 and self.rng.random() < 0.3:
            return "".join(f"《{s}》" for s in subjects)
        return self._render_subjects(predicate, subjects)

    def _person_works(self) -> Record:
        """A person first, the works after: 歌手腾格尔是蒙古族，1960年出生在内蒙古，代表作有《天堂》;
        张三是山东济南人，《A》和《B》都是他写的."""
        r = self.rng
        role = r.choice(sorted(PERSON_WORKS))
        kind = {"作者": "book", "导演": "film", "主演": "film", "编剧": "film"}.get(role, "song")
        if role == "创始人":  # 刘强东出生于江苏宿迁，...，他在深圳创办了京东
            kind = "company"
        person = self.person()
        titles: list[str] = []
        count = r.choice((1, 2, 2, 3))
        for _ in range(10):
            if len(titles) == count:
                break
            t = self.company() if kind == "company" else self.title(kind)
            if t not in titles and t != person.name:
                titles.append(t)
        head = person.name
        if r.random() < 0.4:
            head = r.choice(CREDIT_NOUNS.get(role, FOUNDER_NOUNS)) + head
        parts: list[str] = []
        triples: list[tuple[str, str, str]] = []
        taken = {person.name, *titles}
        works = self._fill(
            r.choice(PERSON_WORKS[role]).replace("都", "" if len(titles) == 1 else "都"),
            {"ts": self._titles(role, titles), "他": person.pronoun},
        )
        credits = [(t, role, person.name) for t in titles]
        if r.random() < 0.35:
            # 老舍，满族，北京人，代表作有《骆驼祥子》《茶馆》: side facts as appositions.
            for predicate in r.sample(sorted(SIDE_FACTS), r.choice((1, 2, 2, 3))):
                obj = self._objects(predicate, person.name, 1, set(taken))
                if obj:
                    parts.append(r.choice(SIDE_FACTS[predicate]).format(o=obj[0]))
                    triples.append((person.name, predicate, obj[0]))
            text = "，".join([head, *parts, works])
            return Record(text + "。", triples + credits)
        # No parents here: a second person would make the pronoun of the works ambiguous.
        facts = ("出生地", "出生日期", "毕业院校", "民族", "祖籍", "国籍")
        for fact in r.sample(facts, r.choice((0, 1, 1, 2))):
            c = self.clause(fact, person.name, person)
            if any(t[2] in taken or any(t[2] in x for x in taken) for t in c.triples):
                continue
            if {p for _, p, _ in c.triples} & {p for _, p, _ in triples}:
                continue  # 1953年出生于X，于1948年出生: one birth date a person
            if not parts:
                if not _pronounable(c.text, person.name) or c.text[len(person.name)] == "的":
                    continue
                parts.append(c.text[len(person.name) :])
            elif c.elided is not None:
                parts.append(c.elided)
            else:
                continue
            taken.update(t[2] for t in c.triples)
            triples.extend(c.triples)
        text = head + ("，".join(parts) + "，" if parts else "，") + works
        return Record(text + "。", triples + credits)

    def _pronoun_credits(self) -> Record:
        """A person named first, then a work's credits by 他/她: 周杰伦2007年的专辑《我很忙》里有一首
        《青花瓷》，这首歌由他演唱并谱曲，作词是方文山. Only the album of the intro is stated there."""
        r = self.rng
        kind = r.choice(("song", "song", "film", "book"))
        person = self.person()
        work = self.title(kind)
        if work == person.name:
            return self._single_record()
        taken = {person.name, work}
        intro = r.choice(PRONOUN_INTROS[kind])
        triples: list[tuple[str, str, str]] = []
        album = ""
        if "{a}" in intro:
            albums = self._objects("所属专辑", work, 1, taken)
            if not albums:
                return self._single_record()
            album = albums[0]
            taken.add(album)
            triples.append((work, "所属专辑", album))
        roles = PRONOUN_ROLES[kind]
        mine = r.sample(sorted(roles), r.randint(1, min(2, len(roles))))
        if album and "歌手" not in mine:  # 他的专辑里的歌: he sings it
            mine[0] = "歌手"
        verbs = [roles[x][0] for x in mine]
        nouns = [roles[x][1] for x in mine]
        hands = {("作词",): "歌词", ("作曲",): "曲子", ("作曲", "作词"): "词曲"}
        hand = hands.get(tuple(sorted(mine)), "")
        template = r.choice(
            [
                t
                for t in PRONOUN_CREDITS
                if (hand or "{hand}" not in t) and (len(mine) == 1 or "亲自" not in t)
            ]
        )
        pronoun = r.choice(WORK_PRONOUNS[kind])
        needs_work = "{w}的" in template or "了{w}" in template
        text = self._fill(
            intro,
            {"p": person.name, "w": work, "a": album, "year": str(r.randint(1980, 2023))},
        )
        credit = self._fill(
            template if len(mine) > 1 else template.replace("都", ""),
            {
                "w": pronoun if needs_work or r.random() < 0.6 else "",
                "vs": "并".join(verbs),
                "ns": "和".join(nouns),
                "hand": hand,
                "他": person.pronoun,
            },
        )
        triples.extend((work, x, person.name) for x in mine)
        text += "，" + credit
        others = [x for x in roles if x not in mine]
        if others and r.random() < 0.6:  # 歌词则出自方文山: another role, by name
            role = r.choice(others)
            names = self._objects(role, work, 1, taken)
            if names:
                text += "，" + r.choice(CREDITS[role][1]).format(os=names[0])
                triples.append((work, role, names[0]))
        return Record(text + "。", triples)

    def _everyday(self) -> Record:
        shapes: tuple[tuple[float, Callable[[], Record]], ...] = (
            (0.13, self._credits),
            (0.05, self._pronoun_credits),
            (0.08, self._parallel),
            (0.08, self._shared),
            (0.07, self._respectively),
            (0.10, self._apposition),
            (0.05, self._parents),
            (0.07, self._born),
            (0.05, self._founded),
            (0.06, self._fields),
            (0.10, self._correction),
            (0.10, self._object_facts),
        )
        x = self.rng.random()
        for share, shape in shapes:
            if x < share:
                return shape()
            x -= share
        return self._person_works()

    def _negative(self) -> Record:
        r = self.rng
        # Near misses name a relation beside one of the schema (岳父, 任教, 制片人).
        template = r.choice(NEGATIVES if r.random() < 0.6 else NEAR_MISSES)
        values = {
            "P": self.person().name,
            "P2": self.person().name,
            "CITY": self.city(),
            "BOOK": self.title("book"),
            "BOOK2": self.title("book"),
            "FILM": self.title("film"),
            "SONG": self.title("song"),
            "COM": self.company(),
            "COM2": self.company(),
            "SCH": self.school(),
            "CTRY": self.country(),
            "n": str(r.randint(2, 40)),
            "n2": str(r.randint(0, 5)),
        }
        for slot in _SLOT.findall(template):
            if slot in _NEGATIVE_SLOT_TYPES:
                self._mentions.append((values[slot], _NEGATIVE_SLOT_TYPES[slot]))
        return Record(_SLOT.sub(lambda m: values[m.group(1)], template), [])

    def _compound(self) -> Record:
        """Two independent statements in one text."""
        a, b = self._body(allow_compound=False), self._body(allow_compound=False)
        sep = self.rng.choice(("", "", "另外，", "此外，", "同时，"))
        return Record(a.text + sep + b.text, a.triples + b.triples)

    def _body(self, allow_compound: bool = True) -> Record:
        r = self.rng
        x = r.random()
        if x < 0.10:
            return self._negative()
        if x < 0.23:
            return self._single_record()
        if x < 0.35:
            text, triples, _ = self._chain(
                r.choice(("person", "person", "book", "film", "song", "company"))
            )
            return Record(text, triples)
        if x < 0.44:
            return self._hop()
        if x < 0.49:
            return self._bio_header()
        if x < 0.93 or not allow_compound:
            return self._everyday()
        return self._compound()

    def record(self) -> Record:
        r = self.rng
        for _ in range(50):
            self._mentions = []
            rec = self._body()
            text = rec.text
            if rec.triples and r.random() < 0.3:
                pattern = r.choice(OPENERS)
                year = r.randint(1990, 2023)
                opener = pattern.format(year=year)
                if "{year}年" in pattern:
                    self._mentions.append((f"{year}年", "日期"))
                closer = r.choice(CLOSERS)
                if text.endswith("。") and closer:
                    text = text[:-1] + closer + "。"
                text = opener + text
            companies = [t[0] for t in rec.triples if t[1] in _COMPANY_PREDICATES]
            if companies and r.random() < 0.06:
                # Shop and brand names in quotes: “小满茶饮”的创始人是朱小满.
                for name in dict.fromkeys(companies):
                    text = text.replace(name, f"“{name}”")
            if r.random() < 0.12:
                # Titles also appear without 《》 in everyday writing.
                text = text.replace("《", "").replace("》", "")
            if r.random() < 0.12:
                # A remark in words the templates never use (any common character), before, inside
                # or after the facts: the model learns its cues, not the company they keep.
                noise = self._words()
                commas = [i for i, c in enumerate(text) if c == "，"]
                y = r.random()
                if y < 0.35:
                    text = noise + "，" + text
                elif y < 0.7 and commas:
                    at = r.choice(commas) + 1
                    text = text[:at] + noise + "，" + text[at:]
                elif text.endswith("。"):
                    text = text[:-1] + "，" + noise + "。"
            if r.random() < 0.06 and text.endswith("。"):
                # Chat endings: 哈哈, ～, ！.
                text = text[:-1] + r.choice(CHAT_ENDINGS)
            if r.random() < 0.03:
                text = text.replace("，", r.choice((",", " ")))
            triples = _dedupe(rec.triples)
            # Names of discarded clauses may be recorded too: keep only those in the text.
            named = dict(triple_entities(triples))
            for name, type_ in self._mentions:
                if name in text:
                    named.setdefault(name, type_)
            rec = Record(text, triples, list(named.items()))
            if _valid(rec):
                return rec
        raise RuntimeError("could not generate a valid record")

    def records(self, n: int) -> Iterator[Record]:
        for _ in range(n):
            yield self.record()


# Characters that join the facts of a sentence; names drawn from the wide pools never contain them.
_CUE_CHARS = "的是和与于在由被为及"


@cache
def _common_chars() -> tuple[str, ...]:
    """Ordinary characters of names and brands: those of Faker's ``zh_CN`` names, companies and
    places and of the project's own lists, sorted (the same pool, so the same draws, everywhere)."""
    from faker.providers.address.zh_CN import Provider as Address
    from faker.providers.company.zh_CN import Provider as Company
    from faker.providers.person.zh_CN import Provider as People

    words = [
        *People.first_names,
        *Company.company_prefixes,
        *Address.cities,
        *Address.districts,
        MALE_CHARS,
        FEMALE_CHARS,
        COMPANY_CHARS,
        *TITLE_NOUNS,
    ]
    chars = {c for w in words for c in w if "\u4e00" <= c <= "\u9fff"}
    return tuple(sorted(chars - set(_CUE_CHARS)))


@cache
def _level1_chars() -> tuple[str, ...]:
    """The common characters of GB 2312 level 1 (its rows 16-55, 3,755 characters) in code order,
    less the cue characters."""
    chars = []
    for row in range(0xB0, 0xD8):
        for cell in range(0xA1, 0xFF):
            try:
                char = bytes((row, cell)).decode("gb2312")
            except UnicodeDecodeError:
                continue
            if char not in _CUE_CHARS:
                chars.append(char)
    return tuple(chars)


def _surname(name: str) -> str | None:
    """The family name of a Chinese name (``欧阳`` of ``欧阳修``); None for a foreign name, a
    nickname (小李, 老周) or anything that is not a person's name."""
    if len(name) < 2 or name[0] in "小老" or not all("\u4e00" <= c <= "\u9fff" for c in name):
        return None
    for compound in COMPOUND_SURNAMES:
        if name.startswith(compound) and len(name) > len(compound):
            return compound
    return name[0]


def _pronounable(text: str, subject: str) -> bool:
    """Whether the leading subject of ``text`` may become 他/她 (not before a comma or bracket)."""
    return text.startswith(subject) and text[len(subject) : len(subject) + 1] not in (
        "，",
        "（",
        "、",
        "",
    )


def _dedupe(triples: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    return list(dict.fromkeys(triples))


def _valid(rec: Record) -> bool:
    """Every entity occurs in the text and no entity hides inside another one's first mention."""
    names = {x for s, _, o in rec.triples for x in (s, o)}
    if any(n not in rec.text for n in names):
        return False
    for a in names:
        for b in names:
            if a != b and a in b and 0 <= rec.text.find(a) - rec.text.find(b) < len(b):
                return False
    return True


# Everyday sentences written by hand for training (issue 23's last rounds): the language the
# templates do not reach. Written without reading the evaluation sets; no text of theirs and none of
# their gold triples occurs here (tests/training/test_handwritten.py). docs/training.md tells how.
HAND_WRITTEN = "handwritten.jsonl"


def hand_written_records() -> list[Record]:
    """The project's hand-written training sentences (``training/handwritten.jsonl``), their
    ``entities`` the typed arguments of their triples (the sentences carry no other labels).

    Raises OSError when the file cannot be read, ValueError naming the line that is not a record.
    """
    lines = importlib.resources.files("training").joinpath(HAND_WRITTEN).read_text("utf-8")
    records = []
    for n, line in enumerate(lines.splitlines(), 1):
        try:
            doc = json.loads(line)
            text, triples = doc["text"], [(s, p, o) for s, p, o in doc["triples"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{HAND_WRITTEN} line {n}: not a training record ({exc})") from None
        records.append(Record(text, triples, triple_entities(triples)))
    return records


def write_records(
    fh: IO[str], n: int, seed: int, split: str = "train", extra: Sequence[Record] = ()
) -> int:
    """Write ``n`` records of the corpus ``seed`` and ``split`` name, one JSON line each, to ``fh``,
    then the ``extra`` records (the hand-written sentences); return the number of lines."""
    for rec in CorpusGenerator(seed, split).records(n):
        fh.write(rec.to_json() + "\n")
    fh.writelines(rec.to_json() + "\n" for rec in extra)
    return n + len(extra)


def write_corpus(
    path: Path, n: int, seed: int, split: str = "train", extra: Sequence[Record] = ()
) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        return write_records(fh, n, seed, split, extra)
