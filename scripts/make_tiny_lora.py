"""Write a small LoRA adapter for the tiny Llama of ``scripts/make_tiny_model.py``, in PEFT's
file layout, without downloading anything or needing ``peft``.

Run it with the vLLM virtualenv's Python (it has torch and safetensors):

    ~/.cache/prefix-router/vllm-env/bin/python scripts/make_tiny_lora.py \\
        --model-dir ~/.cache/prefix-router/tiny-llama --out /tmp/sql

What it writes into ``--out``: ``adapter_config.json`` (``peft_type: LORA``, rank ``--rank``,
targets ``q_proj`` and ``v_proj``) and ``adapter_model.safetensors`` with one ``lora_A`` /
``lora_B`` pair per target of every layer, random (seeded) small weights - what vLLM's
``--lora-modules NAME=PATH`` loads. The tiny model itself serves with ``--load-format dummy``, so
the adapter only has to have the right shapes: the routing under test never reads the text.

Cost: well under a second (a few KB of tensors).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import torch
    from safetensors.torch import save_file

    cfg = json.loads((Path(args.model_dir) / "config.json").read_text())
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim", hidden // heads)
    g = torch.Generator().manual_seed(args.seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for proj, out_dim in (("q_proj", heads * head_dim), ("v_proj", kv_heads * head_dim)):
            name = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(args.rank, hidden, generator=g) * 0.01
            tensors[f"{name}.lora_B.weight"] = torch.randn(out_dim, args.rank, generator=g) * 0.01
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": args.rank, "lora_alpha": 2 * args.rank,
        "lora_dropout": 0.0, "bias": "none", "target_modules": ["q_proj", "v_proj"],
        "base_model_name_or_path": str(args.model_dir), "fan_in_fan_out": False,
        "modules_to_save": None, "use_rslora": False, "use_dora": False}, indent=1))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
