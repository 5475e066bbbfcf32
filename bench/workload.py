"""The fixed-seed workload: DuIE-style Chinese texts with a realistic length mix.

Sentences come from the project's corpus generator (held-out split). Most texts are one sentence
(median about 35 characters); some join two or three; a long tail joins up to 16 (several hundred
characters, some past the model's 254-token window, so windowing is exercised too).
"""

from __future__ import annotations

import functools
import random

SEED = 6
POOL = 4000


@functools.lru_cache(maxsize=4)
def texts(n: int = POOL, seed: int = SEED) -> tuple[str, ...]:
    """``n`` texts, the same for the same ``n`` and ``seed``."""
    from training.corpus import CorpusGenerator

    gen = CorpusGenerator(seed, "heldout")
    rng = random.Random(seed)
    sentences = iter(gen.records(n * 4))
    out: list[str] = []
    for _ in range(n):
        r = rng.random()
        k = 1 if r < 0.65 else rng.randint(2, 3) if r < 0.9 else rng.randint(4, 16)
        parts = [next(sentences).text for _ in range(k)]
        out.append("".join(p if p.endswith(("。", "！", "？")) else p + "。" for p in parts))
    return tuple(out)


def request_texts(requests: int, seed: int = SEED) -> list[str]:
    """The request stream: the pool repeated in a seeded shuffled order, ``requests`` long."""
    pool = texts(POOL, seed)
    rng = random.Random(seed + 1)
    order: list[str] = []
    while len(order) < requests:
        block = list(pool)
        rng.shuffle(block)
        order.extend(block)
    return order[:requests]
