"""The incremental encoder is token-for-token the library's ``encode``, on random edits.

Property tests (hypothesis): a realistic rendered chat prompt (system prompt with a date, a
name, rules, code, tool JSON, non-ASCII text, chat markers of three formats) gets one to four
random edits at random positions — insertions of chat markers, partial markers, whitespace runs,
CRLF, digits, combining marks, non-ASCII text; deletions; replacements — and the spliced
encoding of the edited text must equal ``tokenizers``' own encoding of it (ids and start
offsets), for every family of :mod:`.tokenizer_families`, with and without special tokens added
by the post-processor. A second edit is spliced from the first one's encoding. Every
disagreement fails. ``PREFIX_ROUTER_FUZZ=long`` runs many more examples (minutes).
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

pytest.importorskip("tokenizers")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from templates_audit.incremental import Encoded, IncrementalEncoder, _PrefixIndex
from templates_audit.tokenizer_rules import LEVEL_SPLITS, LEVEL_WORDS

from .tokenizer_families import FAMILIES

settings.register_profile("default", max_examples=40, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = "long" if os.environ.get("PREFIX_ROUTER_FUZZ") == "long" else "default"

RULES = "\n".join(
    f"Rule {i}: when the customer asks about {topic}, explain the policy in plain words, "
    f"cite section {i} of the handbook and offer further help." for i, topic in
    enumerate(["billing", "shipping", "returns", "warranty", "accounts", "security"]))
PROMPTS = [
    # ChatML, the date and the user's name near the top
    "<|im_start|>system\nYou are the ACME help desk.\nCurrent date: 2025-05-20\n"
    f"The user's name is Alice.\n{RULES}\nBe concise.<|im_end|>\n"
    "<|im_start|>user\nHow do I reset my password?<|im_end|>\n<|im_start|>assistant\n",
    # Llama 3 headers, code and indentation, tool JSON
    "<|start_header_id|>system<|end_header_id|>\n\nYou write Python.\n\n```python\n"
    "def f(x):\n    return x  * 2\n```\n"
    '{"type": "function", "function": {"name": "get_weather", "parameters": {"city": "str"}}}'
    "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nfix it<|eot_id|>",
    # Mistral markers, non-ASCII prose, CRLF, a request id
    "<s>[INST] Réponds en français, naïvement.\r\nRequest-ID: 7f3a9c2e-1b4d\r\n"
    "東京の天気は？ 🎉 café résumé\n\n[/INST] D'accord.</s>[INST] merci [/INST]",
    # a product assistant's system prompt: markdown sections, bullets, a timestamp, a tool
    # schema, a few-shot turn and a user turn with numbers
    "<|im_start|>system\n# Role\nYou are Nova, the shopping assistant of ACME Outdoor "
    "(ACME Corp., est. 1998).\nCurrent time: 2025-05-20T14:03:27Z (UTC).\n\n## Rules\n"
    "- Answer in the customer's language; keep it under 120 words.\n"
    "- Never promise delivery dates; say \"usually 3-5 business days\".\n"
    "- Prices: two decimals and the currency, e.g. $1,249.00 or 39,90 €.\n\n## Tools\n"
    '{"name": "lookup_order", "description": "Find an order by id", "parameters": '
    '{"type": "object", "properties": {"order_id": {"type": "string"}}, '
    '"required": ["order_id"]}}\n<|im_end|>\n<|im_start|>user\nWhere is order #A-77812?'
    "<|im_end|>\n<|im_start|>assistant\nLet me check order #A-77812 for you.<|im_end|>\n"
    "<|im_start|>user\nAnd the 2 tents I returned on 12/05?<|im_end|>\n"
    "<|im_start|>assistant\n",
]
PIECES = ["", " ", "  ", "   ", "\n", "\n\n", "\r\n", "\r", "\t", "x", "The", " hello", "aBc",
          "12", "1234567", " 2025", "'s", "'RE", "é", "e\u0301", "\u0301", "東京", "🎉", "▁",
          "\u00a0", "\u2028", "ﬁ", ".\n", "?!", "...", "/", "<", "|>", "<|im_", "<|im_end|>",
          "<|im_start|>", "<|eot_id|>", "[INST]", "[/INST]", "<s>", "</s>", "<|user|>",
          " <|end|>", "<mask>", " <mask> "]


@st.composite
def edits(draw: st.DrawFn, text: str) -> str:
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.sampled_from([0, 0, 1, 2, 5, 40]))
        new = "".join(draw(st.lists(st.sampled_from(PIECES), max_size=3)))
        text = text[:at] + new + text[at + cut:]
    if draw(st.booleans()):
        text += "".join(draw(st.lists(st.sampled_from(PIECES), max_size=6))) + " more words"
    return text


_ENCODERS: dict[tuple[str, bool], IncrementalEncoder] = {}


def encoder(family: str, add_special_tokens: bool) -> IncrementalEncoder:
    key = (family, add_special_tokens)
    if key not in _ENCODERS:
        _ENCODERS[key] = IncrementalEncoder(FAMILIES[family](), checks=0,
                                            add_special_tokens=add_special_tokens)
    return _ENCODERS[key]


def assert_exact(enc: IncrementalEncoder, got: Encoded, text: str) -> None:
    """``got`` is the library's encoding of ``text`` (ids, offsets), and its restart points
    (untrimmed offsets, word/added-token flags: what later splices rely on) are a whole
    encode's."""
    ids, starts = enc.reference(text)
    assert (list(got.ids), list(got.starts)) == (ids, starts), f"{enc.rules.family}: {text!r}"
    whole = enc.fresh(text)
    assert (got.raw, got.flags) == (whole.raw, whole.flags), f"{enc.rules.family}: {text!r}"


@pytest.mark.parametrize("add_special_tokens", [False, True])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_splice_equals_full_encode(family: str, add_special_tokens: bool) -> None:
    enc = encoder(family, add_special_tokens)

    @settings(settings.get_profile(PROFILE))
    @given(base=st.sampled_from(PROMPTS), data=st.data())
    def check(base: str, data: st.DataObject) -> None:
        first = data.draw(edits(base))
        second = data.draw(edits(first))
        spliced = enc.splice(enc.fresh(base), first)
        assert_exact(enc, spliced, first)
        assert_exact(enc, enc.splice(spliced, second), second)

    check()


def test_families_reach_their_levels() -> None:
    # what each family's rules prove: all but the Bert pre-tokenizer cut inside splits
    levels = {name: encoder(name, False).rules.level for name in FAMILIES}
    assert levels.pop("bert_pre_tokenizer") == LEVEL_SPLITS
    assert set(levels.values()) == {LEVEL_WORDS}, levels


@pytest.mark.parametrize("family", ["byte_level", "sentencepiece_bpe", "unigram_metaspace"])
def test_splices_reuse_most_tokens(family: str) -> None:
    # a changed date and a new user turn: only a few tokens are encoded again
    enc = IncrementalEncoder(FAMILIES[family](), checks=0)
    base = PROMPTS[0]
    enc.encode(base)
    encoded = enc.stats["encoded_tokens"]
    text = base.replace("2025-05-20", "2025-05-21").replace("reset my password", "log in")
    got = enc.encode(text)
    assert enc.stats["spliced"] == 1
    assert enc.stats["encoded_tokens"] - encoded < len(got.ids) // 4
    assert_exact(enc, got, text)


def test_cache_returns_repeats_and_stays_bounded() -> None:
    enc = IncrementalEncoder(FAMILIES["byte_level"](), checks=0, cache_tokens=2000)
    texts = [PROMPTS[0].replace("Alice", f"user {i}") for i in range(40)]
    for text in texts:
        assert_exact(enc, enc.encode(text), text)
    assert enc._index.tokens <= 2000
    again = enc.encode(texts[-1])
    assert again is enc.encode(texts[-1])  # a repeat is the cached encoding itself
    assert enc.stats["repeats"] == 2


def test_prefix_index_evicts_oldest_and_its_digests() -> None:
    import xxhash

    from templates_audit.incremental import _digests

    enc = IncrementalEncoder(FAMILIES["byte_level"](), checks=0)
    index = _PrefixIndex(budget=3 * len(enc.fresh(PROMPTS[1]).ids))
    entries = []
    for i in range(5):
        text = PROMPTS[1] + f" turn {i}"
        e = enc.fresh(text)
        data = text.encode()
        whole = xxhash.xxh3_64_intdigest(data, 1)
        index.add(e, _digests(data), whole)
        entries.append((e, data, whole, text))
    assert len(index) == 2  # budget: two of these texts (plus a token each)
    e, data, whole, text = entries[0]
    assert index.exact(whole, text) is None
    last, data, whole, text = entries[-1]
    assert index.exact(whole, text) is last
    found = index.base(data)  # the newest entry owns the shared prefix digests
    assert found is not None and found[0] is last and found[1] == 256
    live = {id(entries[3][0]), id(last)}
    assert {id(v) for v in index._prefix.values()} <= live  # no digest of an evicted entry


def test_a_wrong_splice_is_caught_and_turns_splicing_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # the old text cuts between two newlines ("\n" then "\nNote"); in the new one an added
    # token follows them and the library merges the run. Without its settle condition, the
    # restart point between the newlines looks safe, and the splice is wrong.
    base_text = PROMPTS[0].replace("Be concise.", "Be concise.\n\nNote")
    text = PROMPTS[0].replace("Be concise.", "Be concise.\n\n")
    right = IncrementalEncoder(FAMILIES["byte_level"](), checks=0)
    assert_exact(right, right.splice(right.fresh(base_text), text), text)

    enc = IncrementalEncoder(FAMILIES["byte_level"](), checks=1)
    # treat the regex as a splitter that looks one character ahead: its settle rule is gone
    monkeypatch.setattr(enc, "rules", dataclasses.replace(enc.rules, boundary="run"))
    assert enc._splice(enc.fresh(base_text), text, 0).ids != enc.reference(text)[0]
    got = enc.splice(enc.fresh(base_text), text)
    assert_exact(enc, got, text)  # the check caught it: the full encode is returned
    assert enc.disabled
    spliced = enc.stats["spliced"]
    enc.splice(got, text + " x")
    assert enc.stats["spliced"] == spliced  # and splicing stays off


def test_block_hashes_reuse_the_base_and_equal_a_fresh_chain() -> None:
    from templates_audit.blocks import block_hashes

    enc = IncrementalEncoder(FAMILIES["llama3"](), checks=0, add_special_tokens=True)
    base = enc.encode(PROMPTS[1])
    base.block_hashes(16)
    text = PROMPTS[1] + "<|start_header_id|>assistant<|end_header_id|>\n\nDone."
    got = enc.encode(text)
    assert got._seed is not None and got._seed[1] > 16
    assert got.block_hashes(16) == block_hashes(got.ids, 16)
    assert got.block_hashes(16, salt="s") == block_hashes(got.ids, 16, salt="s")


def test_short_texts_and_surrogates() -> None:
    enc = IncrementalEncoder(FAMILIES["byte_level"](), checks=0)
    assert_exact(enc, enc.encode("hi"), "hi")
    assert_exact(enc, enc.encode(""), "")
    with pytest.raises(TypeError):
        enc.encode(PROMPTS[0] + "\ud800")


def test_unknown_components_fall_back() -> None:
    spec = json.loads(FAMILIES["byte_level"]())
    spec["model"]["dropout"] = 0.1  # not deterministic: full encodes only
    enc = IncrementalEncoder(json.dumps(spec), checks=0)
    assert enc.rules.level == 0
    enc.encode(PROMPTS[0])
    enc.encode(PROMPTS[0] + " more")
    assert enc.stats["spliced"] == 0 and enc.stats["fresh"] == 2


def test_auditor_reports_are_byte_identical_to_full_encodes(tmp_path: object) -> None:
    # the same mixed trace (dates, names, timestamps, tools, history, completions) audited
    # with the incremental tokenizer and with the library's full encodes
    from templates_audit.analysis import Auditor
    from templates_audit.report import json_report
    from templates_audit.tokenize import HFTokenizer
    from templates_audit.traces import Record

    path = f"{tmp_path}/tokenizer.json"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(FAMILIES["llama3"]())
    system = PROMPTS[0].split("\n", 1)[1].split("<|im_end|>")[0]
    records = []
    for i in range(120):
        text = system.replace("2025-05-20", f"2025-05-{i % 7 + 10}").replace(
            "Alice", ["Alice", "Bruno", "Dmitri"][i % 3])
        if i % 4 == 0:
            text = f"Request time: 12:{i % 60:02d}:{i * 7 % 60:02d}\n" + text
        msgs = [{"role": "system", "content": text}]
        if i % 5 == 0:
            msgs += [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
        msgs.append({"role": "user", "content": f"Question {i}: what about order {i * 7919}?"})
        records.append(Record("t", i + 1, messages=msgs) if i % 9 else
                       Record("t", i + 1, prompt=text + f"\nQ{i}"))
    reports = []
    for incremental in (False, True):
        auditor = Auditor(HFTokenizer(path, incremental=incremental))
        auditor.add_all(records)
        reports.append(json_report.render(auditor.report()))
    assert reports[0] == reports[1]


def test_same_tail_against_brute_force() -> None:
    import random

    from templates_audit.analysis import _same_tail

    rng = random.Random(5)
    for _ in range(500):
        ref = [rng.randrange(4) for _ in range(rng.randrange(0, 60))]
        ids = list(ref)
        for _ in range(rng.randrange(0, 3)):
            if ids:
                ids[rng.randrange(len(ids))] = rng.randrange(4)
        want = next(i for i in range(len(ids) + 1) if ids[i:] == ref[i:])
        assert _same_tail(ids, ref) == want
