"""Issue 23: the generator writes facts the way everyday Chinese text does (verb variants, 由 and 被
forms, appositions, several facts per sentence, coordinated subjects and objects, everyday dates)."""

import re
from collections.abc import Callable

import pytest

from training.corpus import CorpusGenerator, Record, _level1_chars, _surname
from training.schema import PREDICATES, SPOUSE_INVERSE
from training.wordlists import CONTINUATIONS, NEAR_MISSES, REL_NOUNS, TAIL_LEADS, TEMPLATES


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return list(CorpusGenerator(seed=23).records(3000))


def _shape(name: str, n: int = 300, seed: int = 3) -> list[Record]:
    gen = CorpusGenerator(seed=seed)
    make: Callable[[], Record] = getattr(gen, name)
    return [make() for _ in range(n)]


@pytest.mark.parametrize(
    ("predicate", "phrases"),
    [
        ("作者", ("所著", "写的", "创作的", "出自{os}之手", "作者是")),
        ("成立日期", ("创建于", "创办于", "成立于", "始建于", "建于")),
        ("出生日期", ("生于", "出生")),
        ("毕业院校", ("毕业于", "从{o}毕业", "校友", "就读于")),
        ("首都", ("{s}的首都是{o}", "{o}是{s}的首都")),
        ("导演", ("由{os}导演", "由{os}执导")),
        ("主演", ("由{os}主演",)),
        ("出版社", ("由{o}出版",)),
        ("创始人", ("由{os}创立",)),
        ("董事长", ("被任命为",)),
    ],
)
def test_corpus_everyday_verb_variants_per_predicate(predicate: str, phrases: tuple) -> None:
    templates = TEMPLATES[predicate]
    for phrase in phrases:
        assert any(phrase in t for t in templates), (predicate, phrase)


def test_corpus_everyday_every_predicate_has_a_passive_or_by_form() -> None:
    """Every predicate of a work or a company has a 由/被 phrasing; people's facts have none."""
    for predicate in ("作者", "出版社", "导演", "主演", "编剧", "歌手", "作词", "作曲", "创始人"):
        assert any("由" in t for t in TEMPLATES[predicate]), predicate
    assert any("被" in t for t in TEMPLATES["所属专辑"])


@pytest.mark.parametrize(
    "shape",
    [
        "_credits",
        "_shared",
        "_respectively",
        "_parallel",
        "_apposition",
        "_parents",
        "_born",
        "_founded",
        "_fields",
        "_object_facts",
        "_person_works",
        "_pronoun_credits",
    ],
)
def test_corpus_everyday_shapes_spans_are_exact(shape: str) -> None:
    """Each argument of each triple is a span of the text, and names do not nest in each other."""
    recs = _shape(shape)
    assert sum(1 for r in recs if len(r.triples) >= 2) > 0.6 * len(recs)
    for rec in recs:
        for s, p, o in rec.triples:
            assert p in PREDICATES
            assert s in rec.text and o in rec.text, (rec.text, s, p, o)
        assert rec.text.endswith("。") or shape == "_fields"  # a form has no full stop


def test_corpus_everyday_credits_name_several_roles_in_one_sentence() -> None:
    recs = _shape("_credits")
    multi = [r for r in recs if len({p for _, p, _ in r.triples}) >= 2]
    assert len(multi) > 0.8 * len(recs)
    assert all(r.text.count("。") == 1 for r in multi)
    assert any(re.search(r"由.+执导，.+主演", r.text) for r in multi)
    assert any(re.search(r"的导演是.+，主演", r.text) for r in multi)
    # one person in several roles: 《S》由A作词作曲
    assert any(
        len({p for _, p, o in r.triples if o == r.triples[0][2]}) >= 2 for r in recs if r.triples
    )


def test_corpus_everyday_same_predicate_twice(records: list[Record]) -> None:
    """意大利的首都是罗马，西班牙的首都是马德里: both facts are gold."""
    recs = _shape("_parallel")
    capitals = [r for r in recs if sum(1 for _, p, _ in r.triples if p == "首都") >= 2]
    assert any(re.search(r"的首都[是为叫].+[，；].+的首都[是为叫]", r.text) for r in capitals)
    assert sum(1 for r in records if sum(1 for _, p, _ in r.triples if p == "首都") >= 2) > 10
    same = [
        r
        for r in recs
        if len({s for s, _, _ in r.triples}) >= 2
        and len({p for _, p, _ in r.triples} - set(SPOUSE_INVERSE)) <= 1
    ]
    assert len(same) > 0.7 * len(recs)


def test_corpus_everyday_lists_every_member_is_gold() -> None:
    """In 由A、B和C主演 every name of the list is an object, the first one included."""
    for rec in _shape("_credits", 400):
        for m in re.finditer(r"由([^，。由]+?)(?:等)?(?:领衔)?主演", rec.text):
            if re.search("执导|导演|编剧", m.group(1)):
                continue  # 由A编剧并执导、B与C主演: the list after A's roles
            names = re.split(r"、|和|与|以及|及", m.group(1))
            gold = {o for _, p, o in rec.triples if p == "主演"}
            assert set(names) == gold, (rec.text, names, gold)


def test_corpus_everyday_respectively_pairs_in_order() -> None:
    for rec in _shape("_respectively"):
        if "分别" not in rec.text:
            continue
        pairs = sorted(rec.triples, key=lambda t: rec.text.index(t[0]))
        objects_at = [rec.text.index(o, rec.text.index("分别")) for _, _, o in pairs]
        assert objects_at == sorted(objects_at), rec.text


def test_corpus_everyday_shared_subjects_share_the_object() -> None:
    recs = _shape("_shared")
    shared = [r for r in recs if len({s for s, _, _ in r.triples}) >= 2]
    assert len(shared) > 0.9 * len(recs)
    for rec in shared:
        assert len({o for _, _, o in rec.triples}) == 1, rec.text


def test_corpus_everyday_appositions_add_side_facts() -> None:
    recs = _shape("_apposition")
    # 美国导演A执导的《S》: a credit and the person's nationality
    assert any({"导演", "国籍"} <= {p for _, p, _ in r.triples} for r in recs)
    # A，山东济南人，1962年生，...
    assert any(re.match(r"^[^，]+，[^，]+人，", r.text) for r in recs)


def test_corpus_everyday_dates_and_founded_schools(records: list[Record]) -> None:
    dates = [o for r in records for _, p, o in r.triples if p in ("出生日期", "成立日期")]
    assert any(d.endswith("号") for d in dates)
    assert any(re.fullmatch(r"[〇一二三四五六七八九]{4}年", d) for d in dates)
    assert any(re.fullmatch(r"\d{4}年", d) for d in dates)
    founded = {s for r in records for s, p, _ in r.triples if p == "成立日期"}
    assert any(s.endswith(("大学", "学院")) for s in founded)


def test_corpus_everyday_entities_typed(records: list[Record]) -> None:
    """New shapes keep the NER labels right: a school founded is an 机构, a capital a 地点."""
    for rec in records:
        named = dict(rec.entities)
        for s, p, o in rec.triples:
            if p == "成立日期":
                assert named[s] == "机构" and named[o] == "日期"
            if p == "首都":
                assert named[s] == named[o] == "地点"
            if p in ("主演", "导演", "作者"):
                assert named[s] == "作品" and named[o] == "人物"


def test_corpus_everyday_both_parents_in_one_sentence() -> None:
    """Both parents of one child; a draw where two of the three names collide falls back to a
    one-fact sentence, which is rare."""
    records = _shape("_parents", 100)
    parents = [r for r in records if {p for _, p, _ in r.triples} == {"父亲", "母亲"}]
    assert len(parents) >= 95
    for rec in parents:
        assert len({s for s, _, _ in rec.triples}) == 1, rec.text


@pytest.mark.parametrize(
    ("name", "family"),
    [("陈国华", "陈"), ("欧阳修", "欧阳"), ("小李", None), ("莉莉·刘易斯", None), ("张", None)],
)
def test_corpus_everyday_surname(name: str, family: str | None) -> None:
    assert _surname(name) == family


def test_corpus_everyday_fathers_mostly_share_the_surname(records: list[Record]) -> None:
    pairs = [(s, o) for r in records for s, p, o in r.triples if p == "父亲" and _surname(s)]
    same = sum(1 for s, o in pairs if _surname(o) == _surname(s))
    assert 0.5 * len(pairs) < same < len(pairs)


def test_corpus_everyday_founding_years_reach_back(records: list[Record]) -> None:
    years = [
        int(m.group())
        for r in records
        for _, p, o in r.triples
        if p == "成立日期"
        for m in [re.match(r"\d{4}", o)]
        if m
    ]
    assert min(years) < 1950 <= max(years)


def test_corpus_everyday_birth_date_and_place_in_one_phrase() -> None:
    """莫言1955年出生于山东高密: both facts, about one person."""
    for rec in _shape("_born", 100):
        predicates = [p for _, p, _ in rec.triples]
        assert predicates[:2] == ["出生日期", "出生地"], rec.text
        assert len({s for s, p, _ in rec.triples if p not in SPOUSE_INVERSE}) == 1, rec.text


def test_corpus_everyday_founders_and_founding_date_together() -> None:
    for rec in _shape("_founded", 100):
        predicates = {p for _, p, _ in rec.triples}
        assert predicates == {"创始人", "成立日期"}, rec.text


def test_corpus_everyday_fields_are_keyed_values() -> None:
    """姓名：X　民族：Y: every fact of a form stands after a key and a colon."""
    recs = _shape("_fields", 200)
    assert sum(1 for r in recs if len(r.triples) >= 2) > 0.8 * len(recs)
    for rec in recs:
        for _, _, o in rec.triples:
            at = rec.text.find(o)
            assert rec.text[at - 1] in "：:、", rec.text


def test_corpus_everyday_a_year_in_the_template_is_a_fact_where_it_is_one() -> None:
    """张三1962年生在济南 gives the birth year; 马化腾于1998年创办了腾讯 the founding year (a
    template that shows a year without its fact would teach the model to leave it out)."""
    gen = CorpusGenerator(seed=5)
    born = gen.clause("出生地", "张三", template="{s}{year}年生在{o}")
    year = re.search(r"\d{4}年", born.text)
    assert year and ("张三", "出生日期", year.group()) in born.triples
    founded = gen.clause("创始人", "星河传媒", objects=["李四"], template="{os}于{year}年创办了{s}")
    year = re.search(r"\d{4}年", founded.text)
    assert year and ("星河传媒", "成立日期", year.group()) in founded.triples
    married = gen.clause("妻子", "王五", template="{s}和{o}于{year}年结婚")
    assert {p for _, p, _ in married.triples} == {"妻子", "丈夫"}


def test_corpus_everyday_names_without_a_cue_of_their_own(records: list[Record]) -> None:
    """Bare brands, transliterated names and names of any common character occur, so the model
    learns where a name ends from its sentence; every character of GB 2312 level 1 it may meet in
    a name is drawn somewhere in a training-sized sample."""
    companies = {s for r in records for s, p, _ in r.triples if p in ("创始人", "董事长")}
    bare = [c for c in companies if not any(c.endswith(x) for x in ("公司", "集团", "科技"))]
    assert len(bare) > 0.25 * len(companies)
    people = {o for r in records for _, p, o in r.triples if p in ("导演", "主演", "作者")}
    assert sum(1 for p in people if "·" in p) > 0.05 * len(people)
    text = "".join(r.text for r in CorpusGenerator(seed=1).records(20000))
    level1 = _level1_chars()
    assert len(level1) > 3700
    assert sum(1 for c in level1 if c in text) > 0.95 * len(level1)


def test_corpus_everyday_kin_subjects_are_gendered() -> None:
    """我外婆是1936年在湖南湘潭出生的: kin words stand for a person; the spouse of 我老公 is a wife."""
    recs = list(CorpusGenerator(seed=8).records(4000))
    kin = [(s, p, o) for r in recs for s, p, o in r.triples if s.startswith("我")]
    assert kin
    assert all(p != "妻子" for s, p, _ in kin if s in ("我妈", "我外婆", "我奶奶", "我姐"))


def test_corpus_everyday_corrections_make_only_the_right_object_gold() -> None:
    """《子夜》不是巴金写的，而是茅盾写的: one fact (茅盾); the denied name is typed for NER but no
    argument; a denial alone states nothing."""
    gen = CorpusGenerator(seed=4)
    corrected = denied = 0
    for _ in range(300):
        gen._mentions = []
        rec = gen._correction()
        wrong = [name for name, _ in gen._mentions[1::2]]  # (subject, object) pairs
        if not wrong:  # fell back to a plain fact
            continue
        assert all(w in rec.text for w in wrong), rec.text
        objects = {o for _, p, o in rec.triples}
        assert not objects & set(wrong), rec.text
        if rec.triples:
            corrected += 1
            right = rec.triples[0][2]
            assert (
                rec.text.find(right) > rec.text.find(wrong[0])
                or "不是" in rec.text[rec.text.find(right) :]
            ), rec.text
        else:
            denied += 1
            assert re.search("不是|并非|并不是", rec.text), rec.text
    assert corrected > 150 and denied > 30


def test_corpus_everyday_facts_about_a_relations_object() -> None:
    """冯小刚的妻子徐帆是湖北武汉人: the object of the first fact is the subject of the next ones."""
    recs = [
        r
        for r in _shape("_object_facts", 300)
        if r.triples[0][1] in REL_NOUNS
        and any(f"{noun}{r.triples[0][2]}" in r.text for noun in REL_NOUNS[r.triples[0][1]])
    ]
    assert len(recs) > 150
    chained = 0
    for rec in recs:
        first = rec.triples[0]
        later = {s for s, p, _ in rec.triples[1:] if p not in SPOUSE_INVERSE}
        assert later <= {first[2]}, rec.text
        chained += bool(later)
    assert chained > 0.6 * len(recs)


def test_corpus_everyday_a_persons_works_after_the_person() -> None:
    """歌手腾格尔是蒙古族，代表作有《天堂》《蒙古人》; 刘强东...，他创办了京东: every work (or company)
    is credited to the person named first, and titles sometimes stand side by side without a
    separator."""
    recs = _shape("_person_works", 300)
    for rec in recs:
        side = ("出生地", "出生日期", "毕业院校", "民族", "祖籍", "国籍")
        credits = [t for t in rec.triples if t[1] not in side]
        people = {o for _, _, o in credits}
        assert len(people) == 1, rec.text
        person = people.pop()
        assert all(rec.text.find(person) < rec.text.find(w) for w, _, _ in credits), rec.text
    assert any("》《" in r.text for r in recs)
    assert any(p == "创始人" for r in recs for _, p, _ in r.triples)


def test_corpus_everyday_near_misses_state_nothing(records: list[Record]) -> None:
    """岳父, 任教, 制片人, 译者: relations beside the schema's, in sentences without a fact."""
    assert any("岳父" in t for t in NEAR_MISSES) and any("任教" in t for t in NEAR_MISSES)
    stems = [t.split("{")[1].split("}")[1][:3] for t in NEAR_MISSES if "}" in t]
    near = [r for r in records if not r.triples and any(stem in r.text for stem in stems)]
    assert near


def test_corpus_everyday_chained_person_is_never_a_year() -> None:
    """A fact about the founder follows 于1998年创办了X: the follow-up's subject is the person,
    not the year the founding clause also states."""
    for rec in CorpusGenerator(seed=11).records(3000):
        for s, p, _ in rec.triples:
            if p in ("出生地", "出生日期", "妻子", "丈夫", "民族", "国籍"):
                assert not re.fullmatch(r"[\d〇一二三四五六七八九]+年.*", s), rec.text


def test_corpus_everyday_wide_names_mostly_keep_a_gender_cue() -> None:
    """Spouse direction is read from names: wives' given names carry a female character more
    often than husbands' do, even among names drawn from the wide pools."""
    from training.wordlists import FEMALE_CHARS

    gen = CorpusGenerator(seed=6)
    wives = [gen.person(male=False).name for _ in range(2000)]
    husbands = [gen.person(male=True).name for _ in range(2000)]

    def share(names: list[str]) -> float:
        return sum(any(c in FEMALE_CHARS for c in n[1:]) for n in names) / len(names)

    assert share(wives) > share(husbands) + 0.5


def test_corpus_everyday_adverbs_and_quoted_brands(records: list[Record]) -> None:
    """北京大学则创办于1898年; “小满茶饮”的创始人是朱小满: names still end where they end."""
    assert any(
        f"{s}{adv}" in r.text for r in records for s, _, _ in r.triples for adv in ("则", "其实")
    )
    assert any(f"“{s}”" in r.text for r in records for s, p, _ in r.triples if p == "创始人")


def test_corpus_everyday_one_birth_and_founding_date_per_subject() -> None:
    """A year a template states is a fact (_YEAR_FACTS), so a second clause must not state another
    one: 于1995年创立，成立于1983年 would teach two founding dates for one company."""
    for rec in CorpusGenerator(seed=12).records(4000):
        pairs = [
            (s, p) for s, p, _ in rec.triples if p in ("出生日期", "出生地", "成立日期", "民族")
        ]
        assert len(pairs) == len(set(pairs)), rec.text


def test_corpus_everyday_credits_by_pronoun_name_the_person_first() -> None:
    """周杰伦的专辑《我很忙》里有一首《青花瓷》，这首歌由他演唱并谱曲: the person of 他/她 is named before
    the pronoun, with the pronoun of their gender, and is the only person credited by it."""
    gen = CorpusGenerator(seed=3)
    recs = [gen._pronoun_credits() for _ in range(300)]
    checked = 0
    for rec in recs:
        credited = [(w, p, o) for w, p, o in rec.triples if p != "所属专辑"]
        if not credited:
            continue
        person = credited[0][2]
        pronoun = next(c for c in rec.text[rec.text.index("》") :] if c in "他她")
        assert rec.text.index(person) < rec.text.index(pronoun, rec.text.index("》")), rec.text
        assert pronoun == ("他" if gen.genders[person] else "她"), rec.text
        checked += 1
    assert checked > 250
    assert sum("由他" in r.text or "由她" in r.text for r in recs) > 10
    assert any("所属专辑" in [p for _, p, _ in r.triples] for r in recs)


def test_corpus_everyday_places_include_counties_no_list_holds() -> None:
    """湖北仙桃, 安徽无为: county and town names composed of any common characters, after a
    province or a city, so a place is read from where it stands, not from a list."""
    from training.wordlists import PROVINCE_CITIES

    gen = CorpusGenerator(seed=8)
    places = [gen.place() for _ in range(2000)]
    known = {c for cities in PROVINCE_CITIES.values() for c in cities}
    composed = [p for p in places if not any(p.endswith(c) or p.endswith(c + "市") for c in known)]
    assert 0.1 * len(places) < len(composed) < 0.4 * len(places)
    assert any(p.endswith("旗") and p.startswith("内蒙古") for p in places)
    assert not any(p.endswith("旗") and not p.startswith("内蒙古") for p in places)


def test_corpus_everyday_credits_beside_the_schema_state_nothing() -> None:
    """《S》的出品人是A，导演B: a role beside the schema's names a person but credits nobody; a film
    改编自X的小说《Y》 gives Y's author, 改编自X的同名小说 gives nothing."""
    recs = _shape("_credits", 1500, seed=5)
    off = [r for r in recs if "出品人是" in r.text or "制片人是" in r.text or "编曲是" in r.text]
    assert off
    for rec in off:
        for role in ("出品人是", "制片人是", "编曲是"):
            if role in rec.text:
                after = rec.text.split(role, 1)[1]
                assert not any(after.startswith(o) for _, _, o in rec.triples), rec.text
    novels = [r for r in recs if "的小说《" in r.text]
    same = [r for r in recs if "同名小说" in r.text]
    assert novels and same
    for rec in novels:
        novel = rec.text.split("的小说《", 1)[1].split("》", 1)[0]
        assert any(s == novel and p == "作者" for s, p, _ in rec.triples), rec.text
    for rec in same:  # a film's credits have no 作者 of their own
        assert not any(p == "作者" for _, p, _ in rec.triples), rec.text


def test_corpus_everyday_every_ethnicity_is_drawn() -> None:
    """All 56 of China's ethnic groups (门巴族, 乌孜别克族, not only the largest), 汉族 most often."""
    gen = CorpusGenerator(seed=4)
    drawn = [gen.ethnicity() for _ in range(6000)]
    assert len(set(drawn)) == 56
    assert max(set(drawn), key=drawn.count) == "汉族"


PERSON_OBJECTS = (
    *("妻子", "丈夫", "父亲", "母亲", "作者"),
    *("导演", "编剧", "歌手", "创始人", "董事长"),
)


def test_corpus_everyday_remarks_after_a_relations_object_state_nothing() -> None:
    """母亲央金是一位唐卡画师: what is said of a relation's object, outside the schema, adds no triple;
    the object ends where its name ends."""
    remarks = [
        r
        for r in _shape("_object_facts", 400)
        if r.triples[0][1] in PERSON_OBJECTS
        and len(r.triples) == 1 + (r.triples[0][1] in SPOUSE_INVERSE)
        and any(f"{noun}{r.triples[0][2]}" in r.text for noun in REL_NOUNS[r.triples[0][1]])
    ]
    assert len(remarks) > 40
    for rec in remarks:
        subject, predicate, obj = rec.triples[0]
        after = rec.text.split(obj, 1)[1]
        assert after not in ("", "。") and not after.startswith("，"), rec.text
        if predicate in SPOUSE_INVERSE:
            assert rec.triples[1] == (obj, SPOUSE_INVERSE[predicate], subject)


def test_corpus_everyday_chains_name_an_object_by_its_noun() -> None:
    """钱学森...，父亲钱均夫是教育家: a later fact of a chain as the relation's noun and its object
    (subject left out), a remark about that person after it or none."""
    gen = CorpusGenerator(seed=6)
    led = remarked = 0
    for _ in range(400):
        text, triples, _ = gen._chain(gen.rng.choice(("person", "film", "song", "company")))
        for subject, predicate, obj in triples:
            if predicate not in REL_NOUNS or subject == obj:
                continue
            for noun in REL_NOUNS[predicate]:
                for sep in ("，", "；"):
                    if f"{sep}{noun}{obj}" in text:
                        led += 1
                        rest = text.split(f"{sep}{noun}{obj}", 1)[1]
                        remarked += rest[:1] not in ("", "，", "；", "。")
    assert led > 40
    assert 0.4 * led < remarked < led


def test_corpus_everyday_any_words_may_follow_a_fact() -> None:
    """After 《S》 or a person, words of no list as often as the listed continuations: the model
    learns where a fact ends, not which words follow it."""
    gen = CorpusGenerator(seed=8)
    listed = {t for tails in CONTINUATIONS.values() for t in tails}
    template = "{o}的《{s}》{~}"
    free = 0
    for _ in range(300):
        c = gen.clause("作者", gen.title("book"), template=template)
        subject, _, obj = c.triples[0]
        assert c.triples == [(subject, "作者", obj)]
        tail = c.text.split(f"《{subject}》", 1)[1]
        assert tail
        if tail not in listed and not any(
            tail == t.format(n=n) for t in listed for n in range(100)
        ):
            free += 1
            assert any(tail.startswith(lead) for lead in TAIL_LEADS), tail
    assert 0.2 * 300 < free < 0.5 * 300
