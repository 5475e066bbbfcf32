"""Synthetic DuIE-style corpus: Chinese sentences with their (subject, predicate, object) triples.

No labelled corpus can be downloaded here, so the demo model learns from sentences this module
writes: Faker's ``zh_CN`` provider for people, places and companies, the project's own templates and
title lists for the rest. Deterministic from a seed. Two splits draw from disjoint name pools (every
open-class name - person, title, company, school - is assigned to a split by a stable hash), so a
held-out set never shows a name seen in training.

Records are JSON lines ``{"text": ..., "triples": [[subject, predicate, object], ...]}``::

    python -m training.corpus data/train.jsonl --n 20000 --seed 1
    python -m training.corpus data/heldout.jsonl --n 1000 --seed 2 --split heldout

Sentence shapes, mixed at random: one fact; several facts about one subject (the subject elided or
replaced by a pronoun after its first mention); a fact about a work or a company followed by facts
about the person it names (an entity that is object of one triple and subject of the next);
biography headers (``张三，男，汉族，1962年5月生，山东济南人``); lists (``葛优、周润发主演``); titles
with and without 《》; and sentences that name people, places and works but state no relation at all.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from faker import Faker

# --------------------------------------------------------------------------------------------------
# Schema (DuIE conventions; 妻子/丈夫 are always labelled in both directions)

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


# --------------------------------------------------------------------------------------------------
# Phrasings. Each template names the subject {s} and the object {o} (or {os}: a list of one to three
# objects, each its own triple). Decorations: {他} the subject's pronoun, {子女} 儿子/女儿 by the
# subject's gender, {occ} an occupation, {year} a year, {role} a role, {ind} an industry, {dept} a
# department, {n} a number, {city} a city that is not part of any triple.

TEMPLATES: dict[str, list[str]] = {
    "出生地": [
        "{s}出生于{o}",
        "{s}生于{o}",
        "{s}在{o}出生",
        "{s}出生在{o}",
        "{s}的出生地是{o}",
        "{o}是{s}的出生地",
        "出生于{o}的{s}{~}",
        "{s}，{o}人",
        "{s}生在{o}，长在{city}",
        "{s}出生在{o}的一个普通家庭",
        "{s}的家乡在{o}，{他}从小在那里长大",
        "{s}是在{o}出生的",
        "{s}出生的地方是{o}",
        "{s}是{o}生的",
        "{s}{year}年生在{o}",
    ],
    "出生日期": [
        "{s}出生于{o}",
        "{s}生于{o}",
        "{s}于{o}出生",
        "{s}（{o}－）",
        "{s}，{o}出生",
        "{s}的生日是{o}",
        "生于{o}的{s}{~}",
        "{s}出生日期为{o}",
        "{o}，{s}出生了",
        "{s}{o}生，今年{n}岁",
        "{s}是{o}出生的",
        "{s}出生在{o}",
        "{s}生于{o}，今年{n}岁了",
        "{s}的出生日期是{o}",
    ],
    "国籍": [
        "{s}是{o}人",
        "{s}，{o}籍{occ}",
        "{s}拥有{o}国籍",
        "{s}的国籍是{o}",
        "{o}{occ}{s}{~}",
        "来自{o}的{occ}{s}{~}",
        "{s}是一名{o}{occ}",
        "{s}后来加入了{o}国籍",
        "{s}持{o}护照",
        "{s}是个{o}人",
        "{s}是{o}籍",
        "{s}的国籍为{o}",
        "{s}现在是{o}公民",
    ],
    "毕业院校": [
        "{s}毕业于{o}",
        "{s}毕业于{o}{dept}",
        "{s}{year}年考入{o}",
        "{s}本科就读于{o}",
        "{s}曾在{o}读书",
        "{s}于{year}年从{o}毕业",
        "{s}的母校是{o}",
        "{o}校友{s}{~}",
        "{s}是{o}{dept}的毕业生",
        "{s}{year}年毕业于{o}，获得硕士学位",
        "{s}是{o}毕业的",
        "{s}考上了{o}",
        "{s}大学读的是{o}",
        "{s}从{o}毕业后当了{occ}",
        "{s}在{o}念的大学",
    ],
    "妻子": [
        "{s}的妻子是{o}",
        "{s}与妻子{o}{~}",
        "{s}和{o}是一对夫妻",
        "{s}娶了{o}",
        "{s}和{o}于{year}年结婚",
        "{s}与{o}结为夫妻",
        "{s}的老婆{o}{~}",
        "{s}和妻子{o}育有一{子女}",
        "{s}、{o}夫妇{~}",
        "{o}是{s}的妻子",
        "{s}的太太是{o}",
        "{s}的爱人{o}{~}",
        "{s}的老婆叫{o}",
        "{s}和妻子{o}结婚{n}年了",
        "{s}的妻子叫{o}",
    ],
    "丈夫": [
        "{s}的丈夫是{o}",
        "{s}和丈夫{o}{~}",
        "{s}嫁给了{o}",
        "{s}与{o}于{year}年登记结婚",
        "{s}的老公{o}{~}",
        "{o}是{s}的丈夫",
        "{s}与丈夫{o}育有一{子女}",
        "{s}的先生{o}{~}",
        "{s}{year}年嫁给了{o}",
        "{s}的爱人是{o}",
        "{s}的老公叫{o}",
        "{s}和老公{o}结婚{n}年了",
        "{s}的丈夫叫{o}",
    ],
    "父亲": [
        "{s}的父亲是{o}",
        "{s}的父亲{o}是一名{occ}",
        "{o}是{s}的父亲",
        "{s}是{o}的{子女}",
        "{o}的{子女}{s}{~}",
        "{s}的爸爸{o}{~}",
        "{s}，父亲{o}",
        "{s}随父亲{o}来到{city}",
        "{o}之{子女}{s}{~}",
        "{s}出生于一个{occ}家庭，父亲{o}",
        "{s}的父亲叫{o}",
        "{s}的爸爸是{o}",
        "{s}的父亲{o}今年{n}岁",
    ],
    "母亲": [
        "{s}的母亲是{o}",
        "{s}的母亲{o}是一名{occ}",
        "{o}是{s}的母亲",
        "{s}是{o}的{子女}",
        "{o}的{子女}{s}{~}",
        "{s}的妈妈{o}{~}",
        "{s}，母亲{o}",
        "{s}跟着母亲{o}长大",
        "{s}的母亲{o}也是一名{occ}",
        "{s}的母亲叫{o}",
        "{s}的妈妈是{o}",
        "{s}的母亲{o}今年{n}岁",
    ],
    "作者": [
        "《{s}》是{os}创作的长篇小说",
        "《{s}》的作者是{os}",
        "{os}著有《{s}》",
        "{os}写的《{s}》{~}",
        "《{s}》是{os}的代表作",
        "{os}的小说《{s}》{~}",
        "《{s}》，{os}著",
        "{os}于{year}年出版了《{s}》",
        "{os}创作了《{s}》",
        "{s}这本书是{os}写的",
        "{os}的新书《{s}》{~}",
        "《{s}》是{os}写的小说",
        "《{s}》这本书的作者是{os}",
        "{os}写过一本《{s}》",
        "《{s}》，作者{os}",
    ],
    "出版社": [
        "《{s}》由{o}出版",
        "《{s}》，{o}出版",
        "{o}出版了《{s}》",
        "《{s}》是{o}出版的",
        "《{s}》于{year}年由{o}出版发行",
        "{o}推出的《{s}》{~}",
        "《{s}》的出版社是{o}",
        "{o}近日出版了《{s}》",
        "{o}再版了《{s}》",
        "《{s}》是由{o}出版的",
        "《{s}》最早由{o}出版",
        "《{s}》{year}年由{o}出版",
    ],
    "导演": [
        "《{s}》是由{os}执导的电影",
        "{os}导演的《{s}》{~}",
        "《{s}》的导演是{os}",
        "{os}执导了《{s}》",
        "电影《{s}》由{os}执导",
        "{os}拍摄的《{s}》{~}",
        "《{s}》是{os}的导演作品",
        "{os}的新片《{s}》{~}",
        "电视剧《{s}》的导演为{os}",
        "{s}这部片子是{os}拍的",
        "《{s}》是{os}导演的",
        "《{s}》这部电影的导演是{os}",
        "《{s}》由{os}导演",
        "电视剧《{s}》由{os}执导",
    ],
    "主演": [
        "《{s}》由{os}主演",
        "{os}主演的《{s}》{~}",
        "{os}在《{s}》中饰演{role}",
        "《{s}》的主演有{os}",
        "{os}出演了电视剧《{s}》",
        "《{s}》中，{os}扮演{role}",
        "参演《{s}》的演员有{os}",
        "{os}等人主演的《{s}》{~}",
        "{os}联袂出演《{s}》",
        "{os}在电影{s}里演{role}",
        "《{s}》的主角是{os}",
        "《{s}》的女主角是{os}",
        "《{s}》的男主角是{os}",
        "{os}演的《{s}》{~}",
        "《{s}》由{os}领衔主演",
    ],
    "编剧": [
        "《{s}》的编剧是{os}",
        "{os}编剧的《{s}》{~}",
        "《{s}》由{os}担任编剧",
        "{os}创作了《{s}》的剧本",
        "《{s}》的剧本出自{os}之手",
        "《{s}》（编剧：{os}）",
        "{os}执笔编写了《{s}》的剧本",
        "{os}为电影《{s}》写了剧本",
        "《{s}》编剧{os}{~}",
        "《{s}》是{os}编剧的",
        "《{s}》的剧本是{os}写的",
        "《{s}》的编剧为{os}",
    ],
    "歌手": [
        "《{s}》是{os}演唱的歌曲",
        "{os}演唱的《{s}》{~}",
        "{os}唱的{s}{~}",
        "《{s}》的原唱是{os}",
        "{os}的歌曲《{s}》{~}",
        "{os}在演唱会上演唱了《{s}》",
        "《{s}》由{os}演唱",
        "{os}的新歌《{s}》{~}",
        "{os}发行了单曲《{s}》",
        "《{s}》这首歌是{os}唱的",
        "《{s}》是{os}唱的",
        "这首《{s}》的演唱者是{os}",
        "{os}唱过一首《{s}》",
        "歌曲《{s}》由{os}演唱",
    ],
    "作词": [
        "《{s}》由{os}作词",
        "《{s}》的词作者是{os}",
        "{os}为《{s}》填词",
        "《{s}》（作词：{os}）",
        "《{s}》的歌词出自{os}之手",
        "{os}作词的《{s}》{~}",
        "《{s}》的歌词是{os}写的",
        "{os}给《{s}》写了词",
        "《{s}》，{os}作词",
        "《{s}》的词是{os}写的",
        "歌曲《{s}》由{os}作词",
        "《{s}》的作词人是{os}",
    ],
    "作曲": [
        "《{s}》由{os}作曲",
        "《{s}》的曲作者是{os}",
        "{os}为《{s}》谱曲",
        "《{s}》（作曲：{os}）",
        "{os}作曲的《{s}》{~}",
        "《{s}》的旋律由{os}创作",
        "{os}谱曲的《{s}》{~}",
        "《{s}》，{os}作曲",
        "{os}给《{s}》谱了曲",
        "《{s}》的曲是{os}写的",
        "歌曲《{s}》由{os}作曲",
        "《{s}》的作曲人是{os}",
    ],
    "所属专辑": [
        "《{s}》收录于专辑《{o}》中",
        "《{s}》是专辑《{o}》中的一首歌",
        "专辑《{o}》收录了《{s}》",
        "《{s}》被收录在《{o}》这张专辑里",
        "《{s}》是《{o}》的主打歌",
        "《{o}》专辑中的《{s}》{~}",
        "《{s}》，收录于《{o}》",
        "《{s}》选自专辑《{o}》",
        "《{s}》出自专辑《{o}》",
        "《{s}》收录在专辑《{o}》里",
        "《{s}》收录在《{o}》这张专辑中",
        "专辑《{o}》里有一首《{s}》",
        "歌曲《{s}》收录于《{o}》",
    ],
    "创始人": [
        "{os}创立了{s}",
        "{s}由{os}创办",
        "{s}的创始人是{os}",
        "{s}创始人{os}{~}",
        "{os}于{year}年创办了{s}",
        "{os}一手创建了{s}",
        "{os}共同创立了{s}",
        "作为{s}的创始人，{os}",
        "{s}是{os}创办的公司",
        "{s}由{os}于{year}年创立",
        "{s}是{os}创办的",
        "{s}是{os}一起创办的",
        "创办{s}的是{os}",
        "{s}是{os}在{year}年创立的",
    ],
    "董事长": [
        "{s}董事长{o}{~}",
        "{s}的董事长是{o}",
        "{o}担任{s}董事长",
        "{o}出任{s}董事长",
        "{o}是{s}的董事长",
        "{s}董事长兼总裁{o}{~}",
        "{o}现任{s}董事长",
        "{o}，{s}董事长",
        "{s}的现任董事长{o}{~}",
        "{s}的董事长叫{o}",
        "{o}目前担任{s}的董事长",
        "{s}的董事长一直是{o}",
    ],
    "总部地点": [
        "{s}总部位于{o}",
        "{s}的总部在{o}",
        "{s}总部设在{o}",
        "{s}是一家总部位于{o}的{ind}公司",
        "总部位于{o}的{s}{~}",
        "{s}总部坐落于{o}",
        "{s}将总部迁至{o}",
        "{s}的总部地址在{o}",
        "{s}把总部搬到了{o}",
        "{s}的总部设在{o}",
        "{s}总部在{o}",
        "{s}总部设于{o}",
    ],
    "成立日期": [
        "{s}成立于{o}",
        "{s}于{o}成立",
        "{s}创立于{o}",
        "{s}始创于{o}",
        "{o}，{s}正式成立",
        "{s}创建于{o}",
        "{s}的成立时间是{o}",
        "成立于{o}的{s}{~}",
        "{s}（成立于{o}）",
        "{s}是{o}成立的",
        "{s}成立的时间是{o}",
        "{s}在{o}成立",
    ],
    "首都": [
        "{s}的首都是{o}",
        "{o}是{s}的首都",
        "{s}首都{o}{~}",
        "{o}作为{s}的首都{~}",
        "{s}的首都为{o}",
        "{s}，首都{o}",
        "来到{s}首都{o}",
        "{o}，{s}的首都",
        "{s}的首都{o}是一座历史悠久的城市",
        "{s}的首都是{o}，不是{city}",
        "{s}首都是{o}",
    ],
    "祖籍": [
        "{s}祖籍{o}",
        "{s}的祖籍是{o}",
        "{s}，祖籍{o}",
        "{s}祖籍在{o}",
        "祖籍{o}的{s}{~}",
        "{s}原籍{o}",
        "{s}籍贯{o}",
        "{s}的祖上来自{o}",
        "{s}的籍贯是{o}",
        "{s}祖籍是{o}",
        "{s}的祖籍在{o}",
    ],
    "民族": [
        "{s}，{o}",
        "{s}是{o}",
        "{s}是{o}人",
        "{o}{occ}{s}{~}",
        "{s}属于{o}",
        "{s}的民族是{o}",
        "{s}出身于一个{o}家庭",
        "{o}姑娘{s}{~}",
        "{s}为{o}",
        "{s}的民族为{o}",
    ],
}

# Sentences that name people, places and works but state none of the relations above.
NEGATIVES: tuple[str, ...] = (
    "{P}昨天在{CITY}参加了一场发布会。",
    "{P}和{P2}是大学同学，两人经常一起打球。",
    "我在去{CITY}的火车上读完了《{BOOK}》。",
    "{P}在{COM}工作了{n}年，去年辞职了。",
    "{P}去年搬到了{CITY}，在那里开了一家小店。",
    "《{FILM}》上映首周票房突破{n}亿元。",
    "{COM}今年第一季度营收同比增长{n}%。",
    "{P}受邀到{SCH}做了一场讲座。",
    "{P}正在{CITY}拍摄新片，预计明年上映。",
    "周末我和朋友去看了《{FILM}》，剧情还不错。",
    "{P}说自己最喜欢的城市是{CITY}。",
    "{P}的女儿今年{n}岁了，在{CITY}上小学。",
    "{COM}宣布将在{CITY}开设新的研发中心。",
    "{P}和{P2}在节目中同台演唱了《{SONG}》。",
    "昨晚的演唱会上，{P}翻唱了好几首老歌。",
    "{P}在采访中谈到了《{BOOK}》对自己的影响。",
    "{P}毕业后一直在{CITY}生活。",
    "{CITY}今天最高气温{n}℃，{P}提醒大家注意防暑。",
    "{P}推荐了《{BOOK}》和《{BOOK2}》两本书。",
    "{COM}与{COM2}签署了战略合作协议。",
    "{P}曾经在{CTRY}留学{n}年。",
    "我最近在听{P}的新专辑，很好听。",
    "{P}和{P2}一起去{CITY}旅游了。",
    "《{SONG}》这首歌在网上很火。",
    "{P}的公司上个月搬到了新办公楼。",
    "{P}计划明年去{CTRY}参加电影节。",
    "{SCH}今年的录取分数线比去年高了{n}分。",
    "{P}向{SCH}捐赠了{n}万元。",
    "{P}认为《{FILM}》是近年来最好的国产片之一。",
    "{CTRY}队在比赛中以{n}比{n2}获胜。",
)

# What follows a noun-phrase phrasing ("{s}与妻子{o}") to make it a statement, by subject type.
_PERSON_TAILS = (
    "一同出席了颁奖典礼",
    "近日接受了记者采访",
    "昨天现身机场",
    "出席了新书发布会",
    "参加了一档综艺节目",
    "捐资修建了一所小学",
    "一起参加了公益活动",
    "登上了杂志封面",
)
_WORK_TAILS = (
    "即将上映",
    "于近日发布",
    "广受好评",
    "获得了多项大奖",
    "一经推出便大受欢迎",
    "在网络上引发热议",
    "口碑很好",
    "成为当年的热门作品",
)
_ORG_TAILS = (
    "近日宣布了新的融资计划",
    "发布了年度财报",
    "员工超过{n}万人",
    "今年营收大幅增长",
    "在业内享有很高声誉",
)
CONTINUATIONS: dict[str, tuple[str, ...]] = {
    "人物": _PERSON_TAILS,
    "图书作品": _WORK_TAILS,
    "书籍": _WORK_TAILS,
    "影视作品": _WORK_TAILS,
    "歌曲": _WORK_TAILS,
    "企业": _ORG_TAILS,
    "机构": _ORG_TAILS,
    "国家": ("吸引了大量游客", "人口众多", "历史悠久", "风景优美"),
}

# Optional framing around a sentence body (realistic news/encyclopedia/chat registers).
OPENERS = (
    "",
    "",
    "",
    "",
    "",
    "",
    "据报道，",
    "资料显示，",
    "众所周知，",
    "{year}年，",
    "据介绍，",
    "你知道吗？",
    "值得一提的是，",
    "公开资料显示，",
    "据了解，",
)
CLOSERS = (
    "",
    "",
    "",
    "",
    "",
    "",
    "，深受观众喜爱",
    "，引起了广泛关注",
    "，获得了不少好评",
    "，至今仍被人们津津乐道",
    "，在业内颇有名气",
    "，这一点很多人都不知道",
)

# --------------------------------------------------------------------------------------------------
# Entity pools. Names are drawn from Faker and the lists below; titles from the word lists.

COMPOUND_SURNAMES = ("欧阳", "司马", "上官", "诸葛", "慕容", "东方", "司徒", "夏侯", "皇甫", "令狐")
MALE_CHARS = (
    "伟强磊军洋勇杰涛明超刚平辉鹏华飞鑫波斌宇浩凯健俊帆帅旭宁龙林欢阳建志国文海峰晨博然哲睿轩宏"
    "德成立新振东亮政天子一嘉永瑞泽昊毅锋翔彬松坤晓春云山岩伦杭铭"
)
FEMALE_CHARS = (
    "芳娜敏静丽艳娟霞燕玲婷雪慧颖琳洁晶倩红梅兰萍莉佳欣怡悦雯璐菲蕾月瑶婉琪露岚丹妍薇珊娇秀淑思"
    "雨梦彤诗晓小美玉凤清苗茜曦蓉"
)
FOREIGN_FIRST_M = (
    "约翰",
    "迈克尔",
    "大卫",
    "詹姆斯",
    "汤姆",
    "杰克",
    "彼得",
    "保罗",
    "托马斯",
    "乔治",
    "丹尼尔",
    "马克",
    "亚历山大",
    "安德烈",
    "让",
    "弗兰克",
    "马丁",
)
FOREIGN_FIRST_F = (
    "玛丽",
    "安娜",
    "莉莉",
    "艾玛",
    "索菲亚",
    "劳拉",
    "朱莉娅",
    "凯特",
    "艾米丽",
    "苏珊",
    "伊莎贝拉",
    "娜塔莎",
    "克莱尔",
)
FOREIGN_LAST = (
    "史密斯",
    "约翰逊",
    "布朗",
    "威尔逊",
    "泰勒",
    "安德森",
    "怀特",
    "哈里斯",
    "克拉克",
    "刘易斯",
    "罗宾逊",
    "沃克",
    "格林",
    "贝克",
    "亚当斯",
    "坎贝尔",
    "米勒",
    "戴维斯",
    "杜邦",
    "施密特",
    "伊万诺夫",
    "罗西",
    "加西亚",
    "马丁内斯",
)

PROVINCE_CITIES: dict[str, tuple[str, ...]] = {
    "北京": ("北京",),
    "上海": ("上海",),
    "天津": ("天津",),
    "重庆": ("重庆",),
    "河北": ("石家庄", "唐山", "保定", "邯郸", "张家口"),
    "山西": ("太原", "大同", "运城"),
    "辽宁": ("沈阳", "大连", "鞍山", "丹东"),
    "吉林": ("长春", "吉林", "延边"),
    "黑龙江": ("哈尔滨", "齐齐哈尔", "牡丹江"),
    "江苏": ("南京", "苏州", "无锡", "扬州", "徐州", "南通"),
    "浙江": ("杭州", "宁波", "温州", "绍兴", "金华", "台州"),
    "安徽": ("合肥", "芜湖", "安庆", "黄山"),
    "福建": ("福州", "厦门", "泉州", "漳州"),
    "江西": ("南昌", "九江", "赣州", "景德镇"),
    "山东": ("济南", "青岛", "烟台", "潍坊", "临沂", "威海"),
    "河南": ("郑州", "洛阳", "开封", "南阳"),
    "湖北": ("武汉", "宜昌", "襄阳", "黄冈"),
    "湖南": ("长沙", "株洲", "湘潭", "衡阳", "岳阳", "常德"),
    "广东": ("广州", "深圳", "汕头", "佛山", "东莞", "珠海", "潮州", "梅州"),
    "广西": ("南宁", "桂林", "柳州", "北海"),
    "海南": ("海口", "三亚"),
    "四川": ("成都", "绵阳", "乐山", "宜宾", "自贡"),
    "贵州": ("贵阳", "遵义"),
    "云南": ("昆明", "大理", "丽江", "曲靖"),
    "陕西": ("西安", "宝鸡", "延安", "咸阳"),
    "甘肃": ("兰州", "天水"),
    "内蒙古": ("呼和浩特", "包头"),
    "新疆": ("乌鲁木齐", "喀什"),
    "台湾": ("台北", "高雄", "台中"),
    "香港": ("香港",),
    "澳门": ("澳门",),
}
PROVINCE_SUFFIX = {
    "北京": "市",
    "上海": "市",
    "天津": "市",
    "重庆": "市",
    "内蒙古": "自治区",
    "广西": "壮族自治区",
    "新疆": "维吾尔自治区",
    "香港": "特别行政区",
    "澳门": "特别行政区",
}
DISTRICT_SUFFIXES = ("区", "县")

COUNTRY_CAPITALS: tuple[tuple[str, str], ...] = (
    ("中国", "北京"),
    ("日本", "东京"),
    ("韩国", "首尔"),
    ("美国", "华盛顿"),
    ("英国", "伦敦"),
    ("法国", "巴黎"),
    ("德国", "柏林"),
    ("意大利", "罗马"),
    ("西班牙", "马德里"),
    ("俄罗斯", "莫斯科"),
    ("加拿大", "渥太华"),
    ("澳大利亚", "堪培拉"),
    ("新西兰", "惠灵顿"),
    ("印度", "新德里"),
    ("泰国", "曼谷"),
    ("越南", "河内"),
    ("马来西亚", "吉隆坡"),
    ("埃及", "开罗"),
    ("巴西", "巴西利亚"),
    ("阿根廷", "布宜诺斯艾利斯"),
    ("墨西哥", "墨西哥城"),
    ("荷兰", "阿姆斯特丹"),
    ("比利时", "布鲁塞尔"),
    ("瑞士", "伯尔尼"),
    ("瑞典", "斯德哥尔摩"),
    ("挪威", "奥斯陆"),
    ("芬兰", "赫尔辛基"),
    ("丹麦", "哥本哈根"),
    ("波兰", "华沙"),
    ("奥地利", "维也纳"),
    ("希腊", "雅典"),
    ("土耳其", "安卡拉"),
    ("伊朗", "德黑兰"),
    ("沙特阿拉伯", "利雅得"),
    ("以色列", "耶路撒冷"),
    ("南非", "比勒陀利亚"),
    ("肯尼亚", "内罗毕"),
    ("尼日利亚", "阿布贾"),
    ("印度尼西亚", "雅加达"),
    ("菲律宾", "马尼拉"),
    ("蒙古", "乌兰巴托"),
    ("朝鲜", "平壤"),
    ("巴基斯坦", "伊斯兰堡"),
    ("葡萄牙", "里斯本"),
    ("爱尔兰", "都柏林"),
    ("匈牙利", "布达佩斯"),
    ("捷克", "布拉格"),
    ("乌克兰", "基辅"),
    ("古巴", "哈瓦那"),
    ("智利", "圣地亚哥"),
    ("秘鲁", "利马"),
    ("老挝", "万象"),
    ("柬埔寨", "金边"),
    ("缅甸", "内比都"),
    ("尼泊尔", "加德满都"),
    ("哈萨克斯坦", "阿斯塔纳"),
)
FOREIGN_CITIES = (
    "纽约",
    "洛杉矶",
    "旧金山",
    "芝加哥",
    "多伦多",
    "温哥华",
    "悉尼",
    "墨尔本",
    "大阪",
    "京都",
    "釜山",
    "曼彻斯特",
    "慕尼黑",
    "米兰",
    "巴塞罗那",
    "里昂",
)
ETHNICITIES = (
    "汉族",
    "汉族",
    "汉族",
    "满族",
    "回族",
    "蒙古族",
    "藏族",
    "壮族",
    "维吾尔族",
    "苗族",
    "彝族",
    "土家族",
    "朝鲜族",
    "侗族",
    "瑶族",
    "白族",
    "哈萨克族",
    "傣族",
    "黎族",
    "畲族",
)

REAL_SCHOOLS = (
    "北京大学",
    "清华大学",
    "复旦大学",
    "浙江大学",
    "南京大学",
    "武汉大学",
    "中山大学",
    "中国人民大学",
    "北京师范大学",
    "上海交通大学",
    "南开大学",
    "厦门大学",
    "四川大学",
    "北京电影学院",
    "中央戏剧学院",
    "上海戏剧学院",
    "中央音乐学院",
    "中国传媒大学",
    "中央美术学院",
    "哈尔滨工业大学",
    "同济大学",
    "山东大学",
    "吉林大学",
    "湖南大学",
    "华中科技大学",
    "西安交通大学",
    "北京外国语大学",
    "香港大学",
    "台湾大学",
    "哈佛大学",
    "斯坦福大学",
    "麻省理工学院",
    "剑桥大学",
    "牛津大学",
    "东京大学",
    "加州大学伯克利分校",
    "哥伦比亚大学",
    "耶鲁大学",
    "多伦多大学",
    "新加坡国立大学",
)
SCHOOL_PATTERNS = (
    "{c}大学",
    "{c}师范大学",
    "{c}理工大学",
    "{c}科技大学",
    "{c}财经大学",
    "{c}医科大学",
    "{c}师范学院",
    "{c}农业大学",
    "{c}外国语学院",
    "{c}艺术学院",
    "{c}第一中学",
    "{c}大学{c2}分校",
    "{p}大学",
    "{p}师范大学",
    "{p}工业大学",
    "{c}职业技术学院",
    "{c}音乐学院",
    "{c}体育学院",
)
DEPTS = (
    "表演系",
    "中文系",
    "计算机系",
    "新闻系",
    "法学院",
    "经济学院",
    "音乐系",
    "导演系",
    "物理系",
    "数学系",
    "外语系",
    "美术系",
    "管理学院",
    "历史系",
    "建筑系",
)
PUBLISHERS_FIXED = (
    "人民文学出版社",
    "作家出版社",
    "中信出版社",
    "译林出版社",
    "商务印书馆",
    "中华书局",
    "生活·读书·新知三联书店",
    "上海译文出版社",
    "北京联合出版公司",
    "长江文艺出版社",
    "湖南文艺出版社",
    "浙江文艺出版社",
    "花城出版社",
    "外语教学与研究出版社",
    "清华大学出版社",
    "北京大学出版社",
    "机械工业出版社",
    "电子工业出版社",
    "中国青年出版社",
    "广西师范大学出版社",
    "江苏凤凰文艺出版社",
)
PUBLISHER_PATTERNS = (
    "{p}人民出版社",
    "{p}文艺出版社",
    "{p}教育出版社",
    "{p}少年儿童出版社",
    "{c}出版社",
    "{p}科学技术出版社",
    "{c}大学出版社",
    "{p}美术出版社",
)
OCCUPATIONS = (
    "演员",
    "歌手",
    "导演",
    "作家",
    "主持人",
    "企业家",
    "编剧",
    "画家",
    "运动员",
    "教授",
    "律师",
    "医生",
    "工程师",
    "记者",
    "模特",
    "词作家",
    "作曲家",
    "音乐人",
    "科学家",
    "诗人",
    "教师",
    "商人",
    "农民",
    "工人",
    "军人",
    "女演员",
    "男演员",
    "配音演员",
    "制片人",
)
INDUSTRIES = (
    "科技",
    "互联网",
    "电子商务",
    "新能源",
    "汽车",
    "食品",
    "医药",
    "教育",
    "金融",
    "物流",
    "房地产",
    "游戏",
    "通信",
    "服装",
    "传媒",
)
ROLES = (
    "男主角",
    "女主角",
    "一名警察",
    "一位老师",
    "反派",
    "侦探",
    "医生",
    "母亲",
    "父亲",
    "皇帝",
    "将军",
    "记者",
    "律师",
    "小镇青年",
    "出租车司机",
    "女侠",
    "公主",
    "科学家",
    "杀手",
    "大学生",
)
COMPANY_SUFFIXES = (
    "科技有限公司",
    "集团",
    "股份有限公司",
    "网络科技有限公司",
    "集团有限公司",
    "传媒有限公司",
    "电子有限公司",
    "实业有限公司",
    "科技",
    "控股",
    "文化传媒公司",
    "汽车",
    "医药集团",
    "食品有限公司",
    "银行",
    "电器",
    "地产",
    "",
)
COMPANY_CHARS = (
    "华腾瑞泰鼎盛恒达宏远新创天成金海博雅凯越安信永辉星河远景德润中科巨人美的聚源万通"
    "嘉禾光明东方正泰云帆易购蓝海百川思源同方嘉实诚益锦程飞鸿亿达"
)

TITLE_NOUNS = (
    "月光",
    "远方",
    "故乡",
    "春天",
    "江湖",
    "星空",
    "海洋",
    "少年",
    "青春",
    "时光",
    "岁月",
    "山河",
    "城市",
    "梦想",
    "风雨",
    "花开",
    "归途",
    "长夜",
    "黎明",
    "烟火",
    "人间",
    "白鹭",
    "红尘",
    "天空",
    "彩虹",
    "琥珀",
    "灯塔",
    "雪山",
    "草原",
    "河流",
    "秘密",
    "记忆",
    "约定",
    "承诺",
    "旅人",
    "晚风",
    "夏天",
    "冬日",
    "列车",
    "森林",
    "玫瑰",
    "蝴蝶",
    "雨季",
    "纸鸢",
    "乡愁",
    "家园",
    "暗流",
    "孤岛",
    "光年",
    "微光",
    "回声",
    "迷城",
    "大地",
    "长河",
    "边城",
    "黄昏",
    "清晨",
    "码头",
    "胡同",
    "老街",
    "海岸",
    "荒原",
    "流年",
    "初恋",
    "倒影",
    "风筝",
    "麦田",
    "月亮",
    "太阳",
    "星辰",
    "心事",
    "远山",
    "明天",
    "昨天",
    "故事",
    "战争",
    "和平",
)
TITLE_MODIFIERS = (
    "遥远的",
    "最后的",
    "我们的",
    "永远的",
    "温暖的",
    "沉默的",
    "燃烧的",
    "孤独的",
    "平凡的",
    "美丽的",
    "失落的",
    "看不见的",
    "会飞的",
    "北方的",
    "南方的",
    "消失的",
    "蓝色的",
    "红色的",
    "寂静的",
    "漫长的",
    "第一个",
    "小小的",
    "奔跑的",
    "醒来的",
)
TITLE_PATTERNS = (
    "{m}{a}",
    "{a}",
    "{a}{b}",
    "{a}之{b}",
    "我的{a}",
    "{a}往事",
    "{a}笔记",
    "再见{a}",
    "{c}{a}",
    "致{a}",
    "{a}与{b}",
    "{a}的{b}",
    "{n}个{a}",
    "{a}在{c}",
    "寻找{a}",
    "{c}往事",
    "{a}之歌",
    "我和{a}",
    "那年{a}",
    "{a}深处",
    "{a}{y}",
)
FILM_EXTRA = ("{a}风云", "{a}行动", "{a}传", "{a}大侠", "{c}{a}", "{a}密码", "{a}计划", "{a}追凶")
SONG_EXTRA = ("想你的{a}", "{a}的歌", "你是我的{a}", "一路{a}", "{a}里的你", "等你的{a}", "{e}")
ALBUM_EXTRA = ("{a}", "{e}", "{a}·{b}", "{m}{a}", "{a}{y}", "第{n}张专辑{a}")
ENGLISH_TITLES = (
    "Hello",
    "Forever",
    "Dream",
    "Home",
    "Time",
    "Love",
    "Star",
    "Free",
    "One",
    "Go",
    "Rain",
    "Sky",
    "Blue",
    "Summer",
    "Light",
    "Friends",
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

    def to_json(self) -> str:
        return json.dumps(
            {"text": self.text, "triples": [list(t) for t in self.triples]}, ensure_ascii=False
        )


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

    # ---- entities ---------------------------------------------------------------------------
    def _draw(self, make: Callable[[], str]) -> str:
        """A name from this split's pool (names of the other split are redrawn)."""
        for _ in range(200):
            text = make()
            if _split_of(text) == self.split:
                return text
        raise RuntimeError("could not draw a name for this split")

    def person(self, male: bool | None = None) -> Person:
        r = self.rng
        if male is None:
            male = r.random() < 0.55

        def make() -> str:
            if r.random() < 0.06:
                first = r.choice(FOREIGN_FIRST_M if male else FOREIGN_FIRST_F)
                return f"{first}·{r.choice(FOREIGN_LAST)}"
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

    def place(self) -> str:
        r = self.rng
        if r.random() < 0.08:
            country, _ = r.choice(COUNTRY_CAPITALS[1:12])
            return (
                country + r.choice(FOREIGN_CITIES) if r.random() < 0.5 else r.choice(FOREIGN_CITIES)
            )
        prov = r.choice(sorted(PROVINCE_CITIES))
        city = r.choice(PROVINCE_CITIES[prov])
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
        year = r.randint(1920, 2005) if person else r.randint(1950, 2023)
        month, day = r.randint(1, 12), r.randint(1, 28)
        style = r.random()
        if style < 0.45:
            return f"{year}年{month}月{day}日"
        if style < 0.7:
            return f"{year}年{month}月"
        if style < 0.85:
            return f"{year}年"
        if style < 0.93:
            return f"{year}-{month:02d}-{day:02d}"
        return f"{year}年{month:02d}月{day:02d}日"

    def country(self) -> str:
        r = self.rng
        if r.random() < 0.3:
            return "中国"
        return r.choice(COUNTRY_CAPITALS)[0]

    def school(self) -> str:
        r = self.rng

        def make() -> str:
            if r.random() < 0.35:
                return r.choice(REAL_SCHOOLS)
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
            if style < 0.3:
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
        }

    def _join(self, names: list[str]) -> str:
        if len(names) == 1:
            return names[0]
        r = self.rng.random()
        if r < 0.5:
            return "、".join(names)
        if r < 0.8:
            return "、".join(names[:-1]) + "和" + names[-1]
        return "、".join(names[:-1]) + "与" + names[-1]

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
        values["s"] = subject
        values["o"] = objects[0]
        values["os"] = self._join(objects)
        values["~"] = _SLOT.sub(lambda m: values[m.group(1)], values["~"])
        text = _SLOT.sub(lambda m: values[m.group(1)], template)
        triples: list[tuple[str, str, str]] = []
        for obj in objects if many else objects[:1]:
            triples.append((subject, predicate, obj))
            if predicate in SPOUSE_INVERSE:
                triples.append((obj, SPOUSE_INVERSE[predicate], subject))
        elided = None
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
            p = self.person(male)
            return p.name, p
        if kind in ("图书作品", "书籍"):
            return self.title("book"), None
        if kind == "影视作品":
            return self.title("film"), None
        if kind == "歌曲":
            return self.title("song"), None
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
            seen_objects.update(t[2] for t in c.triples)
            if i == 0 or not parts:
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
                obj = c.triples[-1][2] if predicate not in SPOUSE_INVERSE else c.triples[0][2]
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

    def _negative(self) -> Record:
        r = self.rng
        template = r.choice(NEGATIVES)
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
        return Record(_SLOT.sub(lambda m: values[m.group(1)], template), [])

    def _compound(self) -> Record:
        """Two independent statements in one text."""
        a, b = self._body(allow_compound=False), self._body(allow_compound=False)
        sep = self.rng.choice(("", "", "另外，", "此外，", "同时，"))
        return Record(a.text + sep + b.text, a.triples + b.triples)

    def _body(self, allow_compound: bool = True) -> Record:
        r = self.rng
        x = r.random()
        if x < 0.12:
            return self._negative()
        if x < 0.40:
            rec = self._single()
            rec.text += "。"
            return rec
        if x < 0.62:
            text, triples, _ = self._chain(
                r.choice(("person", "person", "book", "film", "song", "company"))
            )
            return Record(text, triples)
        if x < 0.80:
            return self._hop()
        if x < 0.90 or not allow_compound:
            return self._bio_header()
        return self._compound()

    def record(self) -> Record:
        r = self.rng
        for _ in range(50):
            rec = self._body()
            text = rec.text
            if rec.triples and r.random() < 0.3:
                opener = r.choice(OPENERS).format(year=r.randint(1990, 2023))
                closer = r.choice(CLOSERS)
                if text.endswith("。") and closer:
                    text = text[:-1] + closer + "。"
                text = opener + text
            if r.random() < 0.12:
                # Titles also appear without 《》 in everyday writing.
                text = text.replace("《", "").replace("》", "")
            rec = Record(text, _dedupe(rec.triples))
            if _valid(rec):
                return rec
        raise RuntimeError("could not generate a valid record")

    def records(self, n: int) -> Iterator[Record]:
        for _ in range(n):
            yield self.record()


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


def write_corpus(path: Path, n: int, seed: int, split: str = "train") -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    gen = CorpusGenerator(seed, split)
    with path.open("w", encoding="utf-8") as fh:
        for rec in gen.records(n):
            fh.write(rec.to_json() + "\n")
    return n


def read_corpus(path: Path) -> list[dict[str, object]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Write a synthetic DuIE-style corpus (JSON lines)."
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--split", choices=("train", "heldout"), default="train")
    args = parser.parse_args(argv)
    write_corpus(args.out, args.n, args.seed, args.split)
    print(f"{args.out}: {args.n} records (seed {args.seed}, {args.split} names)")


if __name__ == "__main__":
    main()
