"""Build a tiny, servable Llama checkpoint directory without downloading anything.

What it writes into ``--out`` (atomically: built in a sibling temp dir, then renamed):

- ``config.json``: a small ``LlamaForCausalLM`` (hidden 256, 4 layers, vocab 2048, ~3.5M params). There are no
  weights: vLLM serves it with ``--load-format dummy`` (random weights), which is all the router
  tests need — the prefix cache, the scheduler and the metrics are real, the text is noise.
- ``tokenizer.json``: a real byte-level BPE tokenizer trained with the ``tokenizers`` library on
  this Python's own standard-library sources (sorted file list, fixed byte budget, so the result
  is the same on every machine with the same Python).
- ``tokenizer_config.json`` with a ChatML chat template, and the same template as
  ``chat_template.jinja`` (for ``prefix-loadtest replica --chat-template``).
- ``generation_config.json`` and a ``.prefix-router-tiny-model`` stamp: re-running with the same
  spec is a no-op, so ``make vllm-env`` stays idempotent.

Cost: about 10-20 s of one core, dominated by BPE training on ~8 MB of text.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS_BYTES = 8 * 1024 * 1024

# ChatML, as Qwen2.5-style models render it; `add_generation_prompt` opens the assistant turn.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}


def spec_digest() -> str:
    blob = json.dumps([MODEL_CONFIG, CHAT_TEMPLATE, SPECIAL_TOKENS, VOCAB_SIZE, CORPUS_BYTES,
                       sys.version_info[:2], Path(__file__).read_bytes().hex()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def corpus(budget: int = CORPUS_BYTES) -> Iterator[str]:
    """The standard library's .py files in sorted order, up to ``budget`` bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    used = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if "site-packages" in rel or "test" in rel or "tests" in rel:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        yield text
        used += len(text)
        if used >= budget:
            return


def train_tokenizer():  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(name) == i, (name, tok.token_to_id(name))
    return tok


def write_model(out: Path) -> None:
    tok = train_tokenizer()
    out.mkdir(parents=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "config.json").write_text(json.dumps(MODEL_CONFIG, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0}, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": MODEL_CONFIG["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="model directory to create")
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = ap.parse_args(argv)
    out = Path(os.path.expanduser(args.out)).resolve()
    stamp = out / ".prefix-router-tiny-model"
    digest = spec_digest()
    if not args.force and stamp.is_file() and stamp.read_text() == digest:
        print(f"tiny model up to date: {out}", file=sys.stderr)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        write_model(tmp / "m")
        (tmp / "m" / ".prefix-router-tiny-model").write_text(digest)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp / "m", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"tiny model written: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
