"""Small tokenizers of the families the incremental encoder reasons about, trained here.

Each builder trains on a few hundred generated lines (milliseconds) and returns the tokenizer's
JSON. The families: GPT-2's byte-level BPE; Llama 3's split regex + byte-level BPE with NFC,
trimmed offsets and a BOS post-processor; GPT-2 with ``add_prefix_space`` (per-split prefixes);
SentencePiece-style Unigram with Metaspace (prepend ``always`` / ``first``) and NFKC;
SentencePiece BPE without pre-tokenizer (Llama 2: Prepend + Replace normaliser, byte fallback);
``Metaspace(split=False)``; byte-level BPE with chat markers that strip whitespace or must be
single words; T5-style WhitespaceSplit + Metaspace; WordPiece; and a Bert pre-tokenizer (level 1).
"""

from __future__ import annotations

import random
from collections.abc import Callable

CHAT_MARKERS = ["<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|eot_id|>", "[INST]", "[/INST]", "<s>", "</s>"]
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_WORDS = ("the policy customer order refund shipping billing assistant section handbook explain "
          "cite help please today date time user name Alice Bruno naïve café 東京 🎉 résumé "
          "12 345 6789 2025-05-20T12:34:56Z").split()


def corpus(seed: int = 7, lines: int = 300) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 14)))
        out.append(f"Rule {i}: {words}.\n  - {rng.choice(_WORDS)}'s {rng.choice(_WORDS)}, ok?\n\n")
    return out


def _bpe_trainer(vocab: int, specials: list[str], byte_level: bool = True):  # type: ignore[no-untyped-def]
    from tokenizers import pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet() if byte_level else []
    return trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, initial_alphabet=alphabet,
                               show_progress=False)


def byte_level() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(corpus(), _bpe_trainer(600, CHAT_MARKERS[:2]))
    return t.to_str()


def llama3() -> str:
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

    t = Tokenizer(models.BPE(ignore_merges=True))
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.train_from_iterator(corpus(), _bpe_trainer(700, CHAT_MARKERS))
    t.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=True),
        processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", t.token_to_id("<s>"))])])
    return t.to_str()


def gpt2_prefix_space() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    t.train_from_iterator(corpus(), _bpe_trainer(500, CHAT_MARKERS[:2]))
    t.post_processor = processors.ByteLevel(trim_offsets=True)
    return t.to_str()


def unigram(prepend_scheme: str = "always") -> str:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    t = Tokenizer(models.Unigram())
    t.normalizer = normalizers.NFKC()
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend_scheme)
    t.train_from_iterator(corpus(), trainers.UnigramTrainer(
        vocab_size=400, special_tokens=["<unk>", *CHAT_MARKERS], unk_token="<unk>",
        show_progress=False))
    return t.to_str()


def sentencepiece_bpe() -> str:
    """Llama 2 as converted by transformers: no pre-tokenizer, ``Prepend("▁")`` +
    ``Replace(" ", "▁")``, byte fallback."""
    from tokenizers import Tokenizer, models, normalizers

    t = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", *(f"<0x{b:02X}>" for b in range(256))]
    t.train_from_iterator(["▁" + x.replace(" ", "▁") for x in corpus()],
                          _bpe_trainer(600, specials, byte_level=False))
    return t.to_str()


def metaspace_no_split() -> str:
    """Llama 2 as newer conversions write it: ``Metaspace(split=False, prepend_scheme=first)``."""
    import json

    spec = json.loads(sentencepiece_bpe())
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                             "split": False}
    return json.dumps(spec)


def stripping_markers() -> str:
    """Byte-level BPE with Phi-3-style markers: rstrip, lstrip, and a single-word token."""
    from tokenizers import AddedToken, Tokenizer

    t = Tokenizer.from_str(byte_level())
    t.add_special_tokens([
        AddedToken("<|user|>", rstrip=True, special=True, normalized=False),
        AddedToken("<|end|>", lstrip=True, special=True, normalized=False),
        AddedToken("<mask>", single_word=True, special=True, normalized=False)])
    return t.to_str()


def whitespace_unigram() -> str:
    import json

    spec = json.loads(unigram())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}]}
    return json.dumps(spec)


def wordpiece(pre_tokenizer: str = "Whitespace") -> str:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    t.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(),
                                         normalizers.StripAccents()])
    t.pre_tokenizer = getattr(pre_tokenizers, pre_tokenizer)()
    t.train_from_iterator(corpus(), trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[UNK]", "[CLS]", "[SEP]", *CHAT_MARKERS],
        show_progress=False))
    t.post_processor = processors.BertProcessing(("[SEP]", t.token_to_id("[SEP]")),
                                                 ("[CLS]", t.token_to_id("[CLS]")))
    return t.to_str()


FAMILIES: dict[str, Callable[[], str]] = {
    "byte_level": byte_level,
    "llama3": llama3,
    "gpt2_prefix_space": gpt2_prefix_space,
    "unigram_metaspace": unigram,
    "unigram_metaspace_first": lambda: unigram("first"),
    "sentencepiece_bpe": sentencepiece_bpe,
    "metaspace_no_split": metaspace_no_split,
    "stripping_markers": stripping_markers,
    "whitespace_unigram": whitespace_unigram,
    "wordpiece": wordpiece,
    "bert_pre_tokenizer": lambda: wordpiece("BertPreTokenizer"),
}
