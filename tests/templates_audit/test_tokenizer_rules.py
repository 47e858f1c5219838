"""What the rules prove about a tokenizer.json, and where a text may be cut (table-driven)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from templates_audit.tokenizer_rules import (
    GPT2_REGEX,
    KIND_FORCED,
    KIND_SPLIT,
    KIND_WORD,
    LEVEL_FULL,
    LEVEL_SPLITS,
    LEVEL_WORDS,
    NEVER,
    REGEX_ATOMS,
    AddedTokens,
    analyse,
    regex_atoms,
)

# The split regexes of tokenizer.json files in use (as their JSON holds them).
KNOWN_REGEXES = {
    "gpt2": GPT2_REGEX,
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "o200k": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "tekken": r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "deepseek3": r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


@pytest.mark.parametrize("name", sorted(KNOWN_REGEXES))
def test_known_split_regexes_are_made_of_known_atoms(name: str) -> None:
    atoms = regex_atoms(KNOWN_REGEXES[name])
    assert atoms and all(a in REGEX_ATOMS for a in atoms), atoms


def test_regex_atoms_split_only_at_the_top_level() -> None:
    assert regex_atoms(r"a|(b|c)|[|d]|\|") == ["a", "(b|c)", "[|d]", r"\|"]
    assert regex_atoms(r"(a|b") is None


def _bpe(pre: Any = None, normalizer: Any = None, **model: Any) -> dict[str, Any]:
    return {"added_tokens": [{"id": 0, "content": "<|im_end|>", "normalized": False,
                              "special": True}],
            "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": None,
            "model": {"type": "BPE", "vocab": {"a": 1, "b": 2, " ": 3}, "merges": ["a b"],
                      **model}}


SPLIT = {"type": "Split", "pattern": {"Regex": KNOWN_REGEXES["llama3"]}, "behavior": "Isolated",
         "invert": False}
BYTES = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


@pytest.mark.parametrize("spec, level, boundary", [
    (_bpe({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}), LEVEL_WORDS, "regex"),  # GPT-2
    (_bpe({"type": "Sequence", "pretokenizers": [SPLIT, BYTES]}), LEVEL_WORDS, "regex"),  # Llama 3
    (_bpe({"type": "Sequence", "pretokenizers": [SPLIT, SPLIT, BYTES]}), LEVEL_WORDS, "regex"),  # DeepSeek: 2 stages
    (_bpe(None), LEVEL_WORDS, "forced"),  # SentencePiece BPE: pairs no merge joins
    (_bpe(BYTES), LEVEL_WORDS, "forced"),  # byte-level BPE without its regex
    (_bpe({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}), LEVEL_WORDS, "space"),
    (_bpe({"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, {"type": "Metaspace"}]}), LEVEL_WORDS, "run"),
    (_bpe(None, ignore_merges=True), LEVEL_SPLITS, ""),  # a whole word may be one token
    (_bpe(None, continuing_subword_prefix="##"), LEVEL_SPLITS, ""),  # pieces depend on position
    (_bpe({**SPLIT, "pattern": {"Regex": r"\w+|\s+$"}}), LEVEL_SPLITS, ""),  # unknown regex ($ looks at the end)
    (_bpe({**SPLIT, "behavior": "MergedWithPrevious"}), LEVEL_SPLITS, ""),
    (_bpe({"type": "Punctuation"}), LEVEL_SPLITS, ""),
    (_bpe(SPLIT, {"type": "Strip", "strip_left": True, "strip_right": True}), LEVEL_SPLITS, ""),
    (_bpe(SPLIT, {"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}), LEVEL_SPLITS, ""),
    (_bpe(SPLIT, dropout=0.1), LEVEL_FULL, ""),  # not deterministic
    ({**_bpe(SPLIT), "model": {"type": "Unigram", "vocab": [["a", -1.0]]}}, LEVEL_WORDS, "regex"),
    ({**_bpe(None), "model": {"type": "Unigram", "vocab": [["a", -1.0]]}}, LEVEL_SPLITS, ""),  # Viterbi: no forced cuts
    ({**_bpe(None), "model": {"type": "Custom"}}, LEVEL_FULL, ""),
])
def test_levels(spec: dict[str, Any], level: int, boundary: str) -> None:
    rules = analyse(spec, normalize=lambda norm, ch: ch)
    assert (rules.level, rules.boundary) == (level, boundary), rules.reason
    assert rules.reason or level == LEVEL_WORDS


def test_normalised_added_tokens_with_a_normaliser_stop_at_splits() -> None:
    spec = _bpe(SPLIT, {"type": "NFC"})
    spec["added_tokens"].append({"id": 9, "content": "day", "normalized": True})
    assert analyse(spec, normalize=lambda n, c: c).level == LEVEL_SPLITS
    spec["normalizer"] = None  # matched on the raw text then: fine
    assert analyse(spec, normalize=lambda n, c: c).level == LEVEL_WORDS


def test_per_split_prefixes_are_turned_off_inside_splits() -> None:
    gpt2 = analyse(_bpe({"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}))
    assert gpt2.prefixing == "split" and gpt2.mid is not None
    assert gpt2.mid["pre_tokenizer"]["add_prefix_space"] is False
    llama2 = analyse(_bpe(None, {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}),
        normalize=lambda n, c: c.replace(" ", "▁"))
    assert llama2.prefixing == "split" and llama2.boundary == "forced"
    assert [n["type"] for n in llama2.mid["normalizer"]["normalizers"]] == ["Replace"]
    first = analyse(_bpe({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                          "split": True}))
    assert first.prefixing == "first" and first.mid["pre_tokenizer"]["prepend_scheme"] == "never"
    after_split = analyse(_bpe({"type": "Sequence", "pretokenizers": [
        SPLIT, {**BYTES, "add_prefix_space": True}]}))
    assert after_split.prefixing == "none" and after_split.mid is None  # every word gets it


def test_special_tokens_around_the_text() -> None:
    spec = _bpe(SPLIT)
    spec["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "trim_offsets": True, "add_prefix_space": False},
        {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                  {"Sequence": {"id": "A", "type_id": 0}},
                                                  {"SpecialToken": {"id": "</s>", "type_id": 0}}],
         "special_tokens": {"<s>": {"id": "<s>", "ids": [1]}, "</s>": {"id": "</s>", "ids": [2]}}}]}
    rules = analyse(spec, add_special_tokens=True)
    assert (rules.prefix_ids, rules.suffix_ids, rules.trims) == ((1,), (2,), (False,))
    assert analyse(spec).prefix_ids == ()  # vLLM's chat path adds none


LLAMA3 = analyse(_bpe({"type": "Sequence", "pretokenizers": [SPLIT, BYTES]}))


@pytest.mark.parametrize("text, b, kind, need", [
    ("Hello world", 5, KIND_WORD, 9),  # " world": 3 characters from "w" must agree
    ("Hello  world", 6, KIND_WORD, 10),  # inside a space run: from the first non-space
    ("Hello \n\n", 6, KIND_WORD, NEVER),  # only whitespace follows: never settled here
    ("ok\n\n<|im_end|>", 3, KIND_WORD, 14),  # an added token may start in the window: past it
    ("<|im_end|>\nx", 10, KIND_SPLIT, 10),  # after an added token: nothing more
    ("a <|im_e", 8, KIND_SPLIT, 8 + 9),  # "<|im_e" may grow into "<|im_end|>"
    ("Hello world", 0, KIND_WORD, 0),  # the text start
])
def test_need(text: str, b: int, kind: int, need: int) -> None:
    assert LLAMA3.need(text, b, kind) == need


def test_need_of_normaliser_and_forced_cuts() -> None:
    nfc = analyse(_bpe(SPLIT, {"type": "NFC"}), normalize=lambda n, c: c)
    assert nfc.need("caf\u0301 x", 4, KIND_WORD) == NEVER  # a combining mark may compose
    assert nfc.need("caf eat", 3, KIND_WORD) == 7
    forced = analyse(_bpe(None))
    assert forced.need("xab", 2, KIND_FORCED) == NEVER  # the merge "a b" joins a|b
    assert forced.need("aab", 1, KIND_FORCED) == 2  # nothing joins a|a
    assert forced.need("xab", 2, KIND_WORD) == 3  # a split start


def test_added_token_matching_like_tokenizers() -> None:
    added = AddedTokens.from_spec([
        {"id": 1, "content": "<|a|>", "rstrip": True},
        {"id": 2, "content": "<|a|>x"},  # longer: leftmost-longest wins
        {"id": 3, "content": "<|b|>", "lstrip": True},
    ])
    assert added.next_split("q<|a|>x y", 0, 9) == (1, 7)
    assert added.next_split("q<|a|>  y", 0, 9) == (1, 8)  # rstrip takes the spaces after
    assert added.next_split("q  <|b|>", 0, 8) == (1, 8)  # lstrip takes the spaces before
    assert added.next_split("q  <|b|>", 2, 8) == (2, 8)  # ... down to the start only
    assert added.spans("text <|a", 8) and added.spans("text <|a|>", 10)  # "<|a|>x" may follow
    assert not added.spans("text <|b|>", 10)
    assert added.raw_ids == {1, 2, 3} and added.lmax == 6


def test_truncation_and_padding_are_dropped() -> None:
    spec = _bpe(SPLIT)
    spec["truncation"] = {"max_length": 8}
    spec["padding"] = {"length": 8}
    head = analyse(copy.deepcopy(spec)).head
    assert head["truncation"] is None and head["padding"] is None
    json.dumps(head)
