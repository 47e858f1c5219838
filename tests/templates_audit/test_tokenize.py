"""The default tokenizer: deterministic, special tokens whole, line-local, offsets exact."""

from __future__ import annotations

import pytest

from templates_audit.tokenize import DefaultTokenizer, TokenizerError, load_tokenizer

tok = DefaultTokenizer()


@pytest.mark.parametrize(
    "text",
    [
        "You are a helpful assistant.",  # plain prose
        "<|im_start|>system\nHello<|im_end|>\n",  # ChatML specials and newlines
        "[INST] hi [/INST]",  # Mistral specials
        "Current date: 2024-05-20\nBe brief.",  # digits split in groups
        "",  # empty
        "\n\n  indented\tand tabs  \n",  # whitespace runs
        "日本語のテキストと emoji 🎉",  # non-ASCII
    ],
)
def test_offsets_cover_the_text_and_match_encode(text: str) -> None:
    ids, offs = tok.encode_with_offsets(text)
    assert ids == tok.encode(text)
    assert len(ids) == len(offs)
    assert offs == sorted(offs)
    assert all(0 <= o < max(len(text), 1) for o in offs)


def test_special_tokens_are_single_tokens() -> None:
    assert len(tok.encode("<|im_start|>")) == 1
    assert len(tok.encode("<|start_header_id|>")) == 1
    assert tok.encode("<|im_start|>") != tok.encode("<|im_end|>")


def test_newline_is_a_token_boundary() -> None:
    a = tok.encode("line one\nline two")
    b = tok.encode("line one\n") + tok.encode("line two")
    assert a == b


def test_shared_prefix_gives_shared_tokens() -> None:
    base = "You are a helpful assistant for ACME Corp.\n"
    a = tok.encode(base + "Question A")
    b = tok.encode(base + "Question B, longer")
    n = len(tok.encode(base))
    assert a[:n] == b[:n]


def test_about_four_characters_per_token_on_prose() -> None:
    text = (
        "The assistant answers questions about the company's products, explains the return "
        "policy, and escalates billing problems to a human agent when the customer asks for it. "
    ) * 20
    ratio = len(text) / len(tok.encode(text))
    assert 3.0 <= ratio <= 5.5


def test_deterministic_ids_across_instances() -> None:
    assert DefaultTokenizer().encode("stable ids") == tok.encode("stable ids")


def test_load_tokenizer_errors() -> None:
    assert load_tokenizer(None) is load_tokenizer("default")
    with pytest.raises(TokenizerError):
        load_tokenizer("/nonexistent/tokenizer.json")


def test_hf_tokenizer_roundtrip(tmp_path: object) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    t = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "<|im_start|>"])
    t.train_from_iterator(["hello world, the quick brown fox"] * 50, trainer=trainer)
    path = f"{tmp_path}/tokenizer.json"
    t.save(path)
    hf = load_tokenizer(path)
    ids, offs = hf.encode_with_offsets("hello <|im_start|> world")
    assert ids == hf.encode("hello <|im_start|> world")
    assert len(offs) == len(ids)
