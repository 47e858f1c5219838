"""Block keys of requests: exact tokens and hashes, reuse across turns, light imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from templates_audit.blocks import block_hashes
from templates_audit.prompt_keys import PromptKeys
from templates_audit.render import ChatRenderer
from templates_audit.tokenize import HFTokenizer, default_tokenizer

SYSTEM = "\n".join(f"Rule {i}: answer about topic {i}, cite section {i} and stay polite."
                   for i in range(40))


def conversation(turns: int, who: str = "Alice") -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": SYSTEM}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"{who}'s question {t}: how do I fix issue {t}?"})
        msgs.append({"role": "assistant", "content": f"Answer {t}: restart it, then check {t}."})
    return msgs[:-1]  # ends with the user's turn


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("tokenizers")
    from .tokenizer_families import byte_level

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(byte_level(), encoding="utf-8")
    return str(path)


def test_keys_are_the_exact_tokens_and_their_chain(tokenizer_path: str) -> None:
    tok = HFTokenizer(tokenizer_path)
    keys = PromptKeys(tok, ChatRenderer(), block_size=16)
    renderer = ChatRenderer()
    for turns in range(1, 6):
        msgs = conversation(turns)
        got = keys.chat(msgs)
        ids = HFTokenizer(tokenizer_path, incremental=False).encode(renderer.render(msgs))
        assert list(got.ids) == ids
        assert got.hashes == block_hashes(ids, 16)
        assert keys.chat(msgs, salt="tenant").hashes == block_hashes(ids, 16, salt="tenant")


def test_later_turns_and_new_conversations_encode_only_what_is_new(tokenizer_path: str) -> None:
    tok = HFTokenizer(tokenizer_path)
    assert tok.incremental is not None
    keys = PromptKeys(tok)
    first = keys.chat(conversation(1))
    stats = tok.incremental.stats
    encoded = stats["encoded_tokens"]
    later = keys.chat(conversation(3))  # extends the first turn
    assert later.hashes[:len(first.hashes) - 1] == first.hashes[:-1]
    assert stats["encoded_tokens"] - encoded < len(later.ids) // 4
    encoded = stats["encoded_tokens"]
    other = keys.chat(conversation(1, who="Bruno"))  # a new conversation, same system prompt
    assert stats["encoded_tokens"] - encoded < len(other.ids) // 4
    assert other.hashes[0] == first.hashes[0]


def test_default_tokenizer_and_token_id_prompts() -> None:
    keys = PromptKeys(default_tokenizer(), block_size=8)
    text = ChatRenderer().render(conversation(2))
    got = keys.chat(conversation(2))
    ids = default_tokenizer().encode(text)
    assert (list(got.ids), got.hashes) == (ids, block_hashes(ids, 8))
    assert keys.ids(ids).hashes == block_hashes(ids, 8)
    assert keys.text(text).hashes == got.hashes
    with pytest.raises(ValueError):
        PromptKeys(default_tokenizer(), block_size=0)


def test_importing_the_module_loads_neither_jinja_nor_tokenizers() -> None:
    code = ("import sys, templates_audit.prompt_keys; "
            "print(sorted(m for m in ('jinja2', 'tokenizers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_from_files_uses_the_bundled_template(tmp_path: object, tokenizer_path: str) -> None:
    import json
    import shutil

    folder = f"{tmp_path}/model"
    shutil.copytree(str(__import__("pathlib").Path(tokenizer_path).parent), folder)
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    with open(f"{folder}/tokenizer_config.json", "w", encoding="utf-8") as fh:
        json.dump({"chat_template": template}, fh)
    keys = PromptKeys.from_files(folder)
    msgs = conversation(1)
    text = ChatRenderer(template).render(msgs)
    assert list(keys.chat(msgs).ids) == HFTokenizer(folder, incremental=False).encode(text)
