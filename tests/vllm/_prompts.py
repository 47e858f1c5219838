"""Prompt text for the real-vLLM tests: plain lowercase prose, deterministic per seed.

No digits, ids, dates or capitalised names, so the router's volatile-token cut-off never fires
and a system prompt of a few hundred words is wholly a routing key (source PREFIX).
"""

from __future__ import annotations

import random

_WORDS = (
    "the a cache router replica prefix block token model request stream queue server answer "
    "question reads writes keeps sends finds builds quiet rapid steady simple careful bright "
    "river mountain garden window letter market harbor valley forest meadow lantern bridge "
    "engine signal pattern measure balance morning evening summer winter north south east west "
    "and but so then while because although after before under over through across between "
    "small large early late warm cold green blue silver golden wooden paper stone glass"
).split()


def prose(seed: str, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(words)) + "."


def chat(system_seed: str, user: str, system_words: int = 400) -> list[dict[str, str]]:
    return [{"role": "system", "content": prose(system_seed, system_words)},
            {"role": "user", "content": user}]

