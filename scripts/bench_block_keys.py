#!/usr/bin/env python3
"""Router-side cost of exact block keys: µs per request of :class:`PromptKeys.chat` (render with
the chat template, exact incremental tokens, chained 16-token block hashes), issue 25.

Multi-turn chat conversations where each turn extends the previous one (system prompt, then
user / assistant turns of synthetic English, the last message a user turn), at two prompt sizes
(``--sizes``, default 2,048 and 8,192 tokens). Three kinds of request, each timed on its own
(CPU time of this process, ``time.process_time`` around each call) after the same history:

* **first turn** — a new conversation under a system prompt never seen (its whole prompt is
  new text: one library encode);
* **later turn** — turn ``--turns`` of a conversation whose previous turn was keyed (it
  extends that prompt by the assistant reply and a new user turn);
* **known system prompt** — the first turn of a new conversation under a system prompt
  another conversation already used.

``--conversations`` conversations run interleaved turn by turn (the encoder's cache holds the
others meanwhile, as a router's would). The system prompt is ~75 % of the size, the
``--turns`` turns share the rest, so a later turn's prompt is about the size and a first turn's
about 80 % of it (the table shows the mean tokens). A breakdown (render, tokenise, hash) times
the same three steps on a second, fresh :class:`PromptKeys` over the same sequence. Every key
set is also checked against a full library encode of the same prompt (``--check``, a sample):
the benchmark of an exact path that is not exact would be meaningless.

Tokenizer: ``--tokenizer`` (a ``tokenizer.json`` or its directory; default the tiny Llama the
vLLM benchmarks serve, ``~/.cache/prefix-router/tiny-llama``, when built, else a byte-level BPE
trained here as ``scripts/bench_auditor.py`` does); its chat template (default ChatML).

``--doc FILE`` writes the table into FILE's ``block-keys`` section
(``<!-- block-keys:begin -->`` ... ``end``), which ``make bench`` keeps (:mod:`loadtest.doc_blocks`).
Usage: ``python scripts/bench_block_keys.py [--sizes 2048 8192] [--doc docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from loadtest.doc_blocks import replace_block  # noqa: E402
from loadtest.workloads import synthetic_text  # noqa: E402
from templates_audit.prompt_keys import PromptKeys  # noqa: E402
from templates_audit.tokenize import HFTokenizer  # noqa: E402

TINY = Path.home() / ".cache" / "prefix-router" / "tiny-llama"
KINDS = ("first turn", "later turn", "known system prompt")
BLOCK = "block-keys"


def words_for(tokens: int, tok: HFTokenizer, rng: random.Random) -> int:
    """Words of :func:`synthetic_text` giving about ``tokens`` tokens with this tokenizer."""
    sample = synthetic_text(rng, 2000)
    return max(1, round(tokens * 2000 / len(tok.encode(sample))))


class Conversation:
    """One conversation: a system prompt and the turns so far; :meth:`next` adds one."""

    def __init__(self, system: str, rng: random.Random, turn_words: int) -> None:
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}]
        self.rng = rng
        self.turn_words = turn_words

    def next(self) -> list[dict[str, str]]:
        """The messages of the next request (a new user turn after the last reply)."""
        if len(self.messages) > 1:
            self.messages.append({"role": "assistant",
                                  "content": synthetic_text(self.rng, self.turn_words)})
        self.messages.append({"role": "user", "content": synthetic_text(self.rng,
                                                                        self.turn_words)})
        return list(self.messages)


def sequence(size: int, conversations: int, turns: int, tok: HFTokenizer, seed: int
             ) -> list[tuple[str, list[dict[str, str]]]]:
    """(kind or "", messages) of every request, in the order a router would see them: turns
    interleaved across conversations; "" marks requests that only build the history."""
    rng = random.Random(seed)
    per_word = words_for(1000, tok, rng) / 1000
    sys_words = round(0.75 * size * per_word)
    turn_words = max(8, round(0.25 * size * per_word / (2 * turns - 1)))
    systems = [f"You are assistant #{i} of ACME Corp.\n" + synthetic_text(rng, sys_words)
               for i in range(conversations)]
    convs = [Conversation(s, random.Random(seed * 1000 + i), turn_words)
             for i, s in enumerate(systems)]
    out: list[tuple[str, list[dict[str, str]]]] = []
    for t in range(1, turns + 1):
        for c in convs:
            kind = {1: "first turn", turns: "later turn"}.get(t, "")
            out.append((kind, c.next()))
    for i, s in enumerate(systems):  # new conversations under the known system prompts
        c = Conversation(s, random.Random(seed * 7919 + i), turn_words)
        out.append(("known system prompt", c.next()))
    return out


def run(keys: PromptKeys, seq: list[tuple[str, list[dict[str, str]]]], breakdown: bool
        ) -> dict[str, dict[str, list[float]]]:
    """Per kind: CPU µs of each request (``total``; with ``breakdown`` also ``render``,
    ``tokenise``, ``hash``) and its prompt tokens."""
    clock = time.process_time
    res: dict[str, dict[str, list[float]]] = {k: {} for k in KINDS}
    encoded = keys.tokenizer.encoded  # type: ignore[attr-defined]
    for kind, msgs in seq:
        if breakdown:
            t0 = clock()
            text = keys.renderer.render(msgs, None, True)
            t1 = clock()
            enc = encoded(text)
            t2 = clock()
            enc.block_hashes(keys.block_size)
            t3 = clock()
            parts = {"render": t1 - t0, "tokenise": t2 - t1, "hash": t3 - t2, "total": t3 - t0}
            n = len(enc.ids)
        else:
            t0 = clock()
            bk = keys.chat(msgs)
            parts = {"total": clock() - t0}
            n = len(bk.ids)
        if kind:
            for name, secs in parts.items():
                res[kind].setdefault(name, []).append(secs * 1e6)
            res[kind].setdefault("tokens", []).append(n)
    return res


def check(path: str, seq: list[tuple[str, list[dict[str, str]]]], every: int) -> int:
    """Keys of every ``every``-th request, incrementally (the whole sequence keyed in order)
    and by full encodes; returns the number compared (raises on a difference)."""
    inc = PromptKeys(HFTokenizer(path))
    full = PromptKeys(HFTokenizer(path, incremental=False), inc.renderer)
    compared = 0
    for i, (_, msgs) in enumerate(seq):
        a = inc.chat(msgs)
        if i % every == 0:
            b = full.chat(msgs)
            if list(a.ids) != list(b.ids) or a.hashes != b.hashes:
                raise SystemExit(f"request {i}: incremental keys differ from a full encode")
            compared += 1
    return compared


def fmt_us(xs: list[float]) -> str:
    return f"{statistics.mean(xs):,.0f} ({statistics.median(xs):,.0f})"


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| prompt size | request | requests | mean tokens | µs per request, mean (median) "
           "| render | tokenise | hash |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        b = r["breakdown"]
        out.append(f"| {r['size']:,} | {r['kind']} | {len(r['total']):,} | "
                   f"{statistics.mean(r['tokens']):,.0f} | **{fmt_us(r['total'])}** | "
                   f"{statistics.mean(b['render']):,.0f} | {statistics.mean(b['tokenise']):,.0f} "
                   f"| {statistics.mean(b['hash']):,.0f} |")
    return out


def where_time_goes(rows: list[dict[str, Any]]) -> list[str]:
    """A sentence per row of a prompt of at most 2,048 tokens that costs more than 1 ms."""
    out = []
    for r in rows:
        mean = statistics.mean(r["total"])
        if r["size"] > 2048 or mean <= 1000:
            continue
        b = {k: statistics.mean(v) for k, v in r["breakdown"].items() if k != "tokens"}
        tokens = statistics.mean(r["tokens"])
        out.append(f"Over 1 ms: the {r['size']:,}-token *{r['kind']}* ({mean:,.0f} µs). Of the "
                   f"three steps timed apart ({b['total']:,.0f} µs), tokenising takes "
                   f"{b['tokenise']:,.0f} µs ({b['tokenise'] / tokens:.2f} µs per token of "
                   f"~{tokens:,.0f}): the prompt is text never seen, so the `tokenizers` library "
                   f"encodes all of it once; rendering takes {b['render']:,.0f} µs, hashing "
                   f"{b['hash']:,.0f} µs. Later requests that share it reuse those tokens (the "
                   "rows below it).\n")
    return out


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--conversations", type=int, default=60)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokenizer", help="tokenizer.json or its directory (see the docstring)")
    p.add_argument("--check", type=int, default=7, help="compare every N-th request's keys "
                   "with a full encode (0: no check)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--doc", type=Path, help="write the table into this file's block-keys section")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.tokenizer
        if path is None and (TINY / "tokenizer.json").exists():
            path = str(TINY)
        if path is None:
            from bench_auditor import train_tokenizer

            path = str(Path(tmp) / "tokenizer.json")
            train_tokenizer(Path(path), 30)
        make: Callable[[], PromptKeys] = lambda: PromptKeys.from_files(path)  # noqa: E731
        tok_name = make().tokenizer.name
        rows = []
        for size in args.sizes:
            seq = sequence(size, args.conversations, args.turns,
                           make().tokenizer, args.seed)  # type: ignore[arg-type]
            checked = check(path if path.endswith(".json") else str(Path(path) / "tokenizer.json"),
                            seq, args.check) if args.check else 0
            timed = run(make(), seq, breakdown=False)
            parts = run(make(), seq, breakdown=True)
            for kind in KINDS:
                rows.append({"size": size, "kind": kind, **timed[kind],
                             "breakdown": parts[kind]})
                print(f"{size:>6,} tokens, {kind:20s}: {len(timed[kind]['total']):4} requests, "
                      f"~{statistics.mean(timed[kind]['tokens']):,.0f} tokens, "
                      f"{fmt_us(timed[kind]['total'])} µs mean (median)", flush=True)
            print(f"{size:>6,} tokens: {checked} key sets equal to a full encode's", flush=True)
    lines = table(rows)
    print("\n".join(lines + where_time_goes(rows)))
    if args.doc is not None:
        cmd = "python scripts/bench_block_keys.py " + " ".join(argv or sys.argv[1:])
        block = "\n".join([
            f"<!-- {BLOCK}:begin -->",
            "## Exact block keys per request (router side, issue 25)\n",
            f"Written by `{cmd.strip()}` at commit `{commit()}` (tokenizer `{tok_name}`, "
            f"16-token blocks; {args.conversations} conversations of {args.turns} turns per "
            "size, interleaved; CPU time of one process on this shared machine). "
            "`PromptKeys.chat`: render with the chat template, exact tokens through the "
            "incremental encoder, chained block hashes. *First turn*: a new conversation under "
            "a system prompt never seen; *later turn*: the last turn, its previous turn keyed "
            "before; *known system prompt*: a new conversation under a system prompt seen "
            "before. Breakdown columns: means of the three steps timed apart on a second run.\n",
            *lines,
            "",
            *where_time_goes(rows),
            f"<!-- {BLOCK}:end -->",
            "",
        ])
        doc = args.doc.read_text(encoding="utf-8") if args.doc.exists() else ""
        args.doc.write_text(replace_block(doc, BLOCK, block), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
