"""Tokenisers: a dependency-free default and Hugging Face ``tokenizer.json`` files.

vLLM's prefix cache works on token ids, so every block boundary the auditor and the simulated
replica compute depends on the tokeniser. Two implementations share one small protocol:

* :class:`DefaultTokenizer` — deterministic, no dependencies, about four characters per token on
  English prose. It approximates a byte-level BPE the way that matters for prefix caching:
  special tokens (``<|im_start|>``, ``[INST]``, ...) are single tokens; a newline is always its own
  token; letters, digit groups (1-3 digits, as Llama 3 / GPT-4 split numbers) and punctuation runs
  are pre-tokenised like GPT-2's regex (a leading space sticks to the next word) and long pieces are
  cut into chunks of at most :data:`MAX_PIECE_CHARS`. Token ids are a stable 31-bit hash of the
  piece, so two processes agree without sharing a vocabulary.

  Because no token ever spans a newline or a special token, the text can be tokenised line by line
  and each line cached: a 2k-token system prompt that repeats costs one dict lookup per line. That
  is what makes the auditor fast on real traces, where the system prompt repeats on every request.

* :class:`HFTokenizer` — wraps ``tokenizers.Tokenizer.from_file`` (optional extra) for exact token
  and block boundaries of a real model; by default through :mod:`.incremental`, which reuses the
  tokens of a repeated prefix (a template's static part, a conversation's earlier turns) and
  encodes only the rest, token-for-token as the library would. Text is encoded without special
  tokens (a rendered chat prompt, vLLM's chat path); :meth:`HFTokenizer.special_tokens` gives
  the ids vLLM's tokenizer adds around a prompt encoded *with* them (its completions path).

Cost: default tokeniser O(len(text)) on a cache miss (one regex pass), O(lines) on a hit: each
line's ids are cached as one tuple ending in the newline token, so a text is a C-level extend per
line; offsets (new templates only) are computed uncached. A new line that differs from an
earlier one only in its ASCII digits (a timestamp, a date, an order number) costs a lookup per
digit group instead of the regex pass (see :data:`_SHAPES`).
"""

from __future__ import annotations

import functools
import json
import os
import re
from array import array
from itertools import chain
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import xxhash

if TYPE_CHECKING:
    from templates_audit.incremental import Encoded, IncrementalEncoder

__all__ = [
    "MAX_PIECE_CHARS",
    "DefaultTokenizer",
    "ENGINES",
    "EncodeError",
    "FILE_CLASSES",
    "HFTokenizer",
    "Tokenizer",
    "TokenizerError",
    "default_tokenizer",
    "load_tokenizer",
    "tokenizer_class",
    "vllm_pipeline",
]

MAX_PIECE_CHARS = 6


class TokenizerError(ValueError):
    """A tokenizer file could not be loaded."""


class EncodeError(ValueError):
    """A text the tokenizer cannot encode: a Hugging Face tokenizer takes only valid Unicode,
    and a JSON ``\\ud800`` escape decodes to a lone surrogate."""


@runtime_checkable
class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids and the start character offset of each token in ``text``."""
        ...


# Special tokens of the common chat formats: ChatML/Qwen, Llama 3, Mistral, Gemma, DeepSeek.
_SPECIAL = re.compile(
    r"(<\|[^\s|<>]{1,64}\|>"
    r"|<｜[^<>｜]{1,64}｜>"
    r"|</?s>"
    r"|\[/?(?:INST|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_CALLS|TOOL_RESULTS|TOOL_CONTENT)\]"
    r"|<(?:start|end)_of_turn>|<bos>|<eos>)"
)
_PIECE = re.compile(r" ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|_+|[^\S\n]+")
# The same pattern for ASCII text (str.isascii() is O(1)): there [^\W\d_] is [A-Za-z] and \d is
# [0-9], and the explicit classes are faster for re than the Unicode category tests.
_PIECE_ASCII = re.compile(r" ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\s\w]+|_+|[^\S\n]+")


def _piece_id(piece: str) -> int:
    return xxhash.xxh32_intdigest(piece.encode("utf-8", "surrogatepass")) & 0x7FFFFFFF


_NEWLINE_ID = _piece_id("\n")
_NEWLINE = (_NEWLINE_ID,)


def _piece_ids(piece: str) -> tuple[int, ...]:
    """Token ids of one pre-tokenised piece: pieces longer than MAX_PIECE_CHARS are cut."""
    if len(piece) <= MAX_PIECE_CHARS:
        return (_piece_id(piece),)
    return tuple(_piece_id(piece[i : i + MAX_PIECE_CHARS])
                 for i in range(0, len(piece), MAX_PIECE_CHARS))


class _PieceIds(dict[str, tuple[int, ...]]):
    """Ids of the pieces seen so far (one tuple per piece: a long piece is several tokens), so a
    line's ids are a C-level flatten of lookups; a new piece is computed and kept on its first
    lookup (``__missing__``: no exception, no second pass). Cleared when full: words repeat,
    ids do not depend on the cache."""

    def __missing__(self, piece: str) -> tuple[int, ...]:
        if len(self) > _PIECE_IDS_MAX:
            self.clear()
        ids = self[piece] = _piece_ids(piece)
        return ids


_PIECE_IDS = _PieceIds()
_PIECE_IDS_MAX = 1 << 17


def _plain_ids(text: str) -> list[int]:
    """Token ids of text without specials or newlines."""
    # The piece pattern matches every character of a line (letters, digits, punctuation,
    # underscores, whitespace), so the pieces are contiguous.
    pieces = (_PIECE_ASCII if text.isascii() else _PIECE).findall(text)
    return list(chain.from_iterable(map(_PIECE_IDS.__getitem__, pieces)))


def _encode_plain(text: str, base: int, ids: list[int], offs: list[int]) -> None:
    """Ids and start offsets (from ``base``) of text without specials or newlines."""
    get = _PIECE_IDS.get
    pos = base
    for piece in _PIECE.findall(text):
        toks = get(piece) or _piece_ids(piece)
        ids.extend(toks)
        offs.extend(range(pos, pos + len(toks) * MAX_PIECE_CHARS, MAX_PIECE_CHARS))
        pos += len(piece)


def _line_with_offsets(line: str) -> tuple[list[int], list[int]]:
    """Token ids and offsets of one line (no newline inside); not cached (new templates only)."""
    ids: list[int] = []
    offs: list[int] = []
    if "<" not in line and "[" not in line:
        _encode_plain(line, 0, ids, offs)
        return ids, offs
    pos = 0
    for m in _SPECIAL.finditer(line):
        if m.start() > pos:
            _encode_plain(line[pos : m.start()], pos, ids, offs)
        ids.append(_special_id(m.group()))
        offs.append(m.start())
        pos = m.end()
    if pos < len(line):
        _encode_plain(line[pos:], pos, ids, offs)
    return ids, offs


# Lines that differ only in their ASCII digits (timestamps, dates, ticket and order numbers:
# the most common volatile values) have the same piece boundaries — every pattern above treats
# the ten digits alike — so a line is keyed by its *shape* (UTF-8 bytes, digits -> "0") too.
# A shape seen twice gets a :data:`_Plan`: the ids of the digit-free pieces, and where the pieces
# holding digits are (digit groups, or special tokens such as ``<|reserved_12|>``), which are
# the only ones looked up per line. A shape seen once costs one translate and one dict entry.
_SHAPE_TABLE = bytes.maketrans(b"123456789", b"000000000")
# (ids before the first digit piece, ((start, end, is_special, ids after that piece), ...))
_Plan = tuple[tuple[int, ...], tuple[tuple[int, int, bool, tuple[int, ...]], ...]]
_SHAPES: dict[bytes, _Plan | None] = {}
_SHAPES_MAX = 1 << 15  # entries, and
_SHAPES_MAX_BYTES = 8 << 20  # bytes of the keys: cleared when either is reached
_shapes_bytes = 0
_HAS_DIGIT = re.compile(r"[0-9]").search


def _plan(line: str) -> _Plan:
    """The plan of ``line``'s shape (see :data:`_SHAPES`); ``line`` holds an ASCII digit."""
    head: list[int] = []
    run = head
    slots: list[tuple[int, int, bool, tuple[int, ...]]] = []
    pending: tuple[int, int, bool] | None = None

    def piece(start: int, end: int, special: bool) -> None:
        nonlocal run, pending
        text = line[start:end]
        if _HAS_DIGIT(text) is None:
            run.extend((_special_id(text),) if special else _piece_ids(text))
            return
        if pending is not None:
            slots.append((*pending, tuple(run)))
        pending, run = (start, end, special), []

    pattern = _PIECE_ASCII if line.isascii() else _PIECE
    pos = 0
    for m in _SPECIAL.finditer(line):
        for p in pattern.finditer(line, pos, m.start()):
            piece(p.start(), p.end(), False)
        piece(m.start(), m.end(), True)
        pos = m.end()
    for p in pattern.finditer(line, pos):
        piece(p.start(), p.end(), False)
    run.append(_NEWLINE_ID)
    if pending is not None:
        slots.append((*pending, tuple(run)))
    return tuple(head), tuple(slots)


def _planned(line: str, plan: _Plan) -> tuple[int, ...]:
    """``_encode_line(line)`` from the plan of its shape: only the digit pieces are looked up."""
    head, slots = plan
    out = list(head)
    for start, end, special, after in slots:
        text = line[start:end]
        if special:
            out.append(_special_id(text))
        else:
            out += _PIECE_IDS[text]
        out += after
    return tuple(out)


@functools.lru_cache(maxsize=1 << 16)
def _encode_line(line: str) -> tuple[int, ...]:
    """Token ids of one line (no newline inside) followed by a newline token. Cached: prompts
    repeat lines; the trailing newline lets a text be encoded as one flatten of cached lines.
    A new line whose shape (:data:`_SHAPES`) repeats is assembled from the shape's plan."""
    if not line:
        return _NEWLINE
    raw = line.encode("utf-8", "surrogatepass")
    shape = raw.translate(_SHAPE_TABLE)
    if 48 in shape:  # b"0": the line holds an ASCII digit
        plan = _SHAPES.get(shape, False)
        if plan:
            return _planned(line, plan)  # type: ignore[arg-type]
        if plan is None:  # the second line of this shape: plan it
            plan = _SHAPES[shape] = _plan(line)
            return _planned(line, plan)
        global _shapes_bytes
        if len(_SHAPES) >= _SHAPES_MAX or _shapes_bytes >= _SHAPES_MAX_BYTES:
            _SHAPES.clear()
            _shapes_bytes = 0
        _SHAPES[shape] = None
        _shapes_bytes += len(shape)
    if "<" not in line and "[" not in line:
        ids = _plain_ids(line)
    else:
        ids = []
        pos = 0
        for m in _SPECIAL.finditer(line):
            if m.start() > pos:
                ids += _plain_ids(line[pos : m.start()])
            ids.append(_special_id(m.group()))
            pos = m.end()
        if pos < len(line):
            ids += _plain_ids(line[pos:])
    ids.append(_NEWLINE_ID)
    return tuple(ids)


@functools.lru_cache(maxsize=1 << 10)
def _special_id(tok: str) -> int:
    return _piece_id("\x00special:" + tok)


class DefaultTokenizer:
    """Deterministic, dependency-free tokenizer (see the module docstring for how it approximates)."""

    name = "default"

    def encode(self, text: str) -> list[int]:
        # Every line's ids end with a newline token; the text's last line has none.
        out: list[int] = []
        extend = out.extend
        for ids in map(_encode_line, text.split("\n")):
            extend(ids)
        out.pop()
        return out

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        offs: list[int] = []
        pos = 0
        lines = text.split("\n")
        last = len(lines) - 1
        for i, line in enumerate(lines):
            if line:
                lids, loffs = _line_with_offsets(line)
                ids.extend(lids)
                offs.extend([pos + o for o in loffs])
                pos += len(line)
            if i != last:
                ids.append(_NEWLINE_ID)
                offs.append(pos)
                pos += 1
        return ids, offs


# ``tokenizer_class`` values transformers 5 serves straight from ``tokenizer.json`` (its
# ``TokenizersBackend``); any other class name makes it build its own pipeline (`vllm_pipeline`)
FILE_CLASSES = frozenset({"", "PreTrainedTokenizerFast", "TokenizersBackend"})
ENGINES = ("auto", "file", "transformers")


def tokenizer_class(directory: str) -> str:
    """The ``tokenizer_class`` of ``directory``'s ``tokenizer_config.json`` ("" when absent or
    unreadable)."""
    try:
        with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as fh:
            value = json.load(fh).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def vllm_pipeline(directory: str, engine: str = "auto") -> tuple[Any, str, str]:
    """(pipeline, source, warning): the ``tokenizers`` pipeline vLLM tokenises with, for the
    model files in ``directory``.

    vLLM loads tokenizers with transformers' ``AutoTokenizer``. For the classes in
    :data:`FILE_CLASSES` that is ``tokenizer.json`` as written: pipeline None (use the file),
    transformers not imported. Any other ``tokenizer_class`` (``LlamaTokenizerFast``,
    ``Qwen2Tokenizer``, ...) makes transformers 5 construct the class, whose ``__init__`` may
    replace the file's pre-tokenizer and decoder (transformers issue 45488: a byte-level BPE
    named ``LlamaTokenizerFast`` gets a Metaspace pre-tokenizer and loses its spaces), so the
    tokens differ from the file's. Then, when transformers is importable (``engine`` "auto" or
    "transformers"), the pipeline is that instance's ``backend_tokenizer``: token-for-token
    what vLLM gets from the same transformers version, and still a ``tokenizers`` object, so
    the incremental encoder and the post-processor probe work on it unchanged. Without
    transformers, "auto" keeps the file and returns a warning (the tokens may differ from
    vLLM's); "transformers" raises ``TokenizerError``. Cost: one transformers import and load,
    at start-up only."""
    cls = tokenizer_class(directory)
    if engine == "auto" and cls in FILE_CLASSES:
        return None, "tokenizer.json", ""
    try:
        import transformers
    except ImportError:
        if engine == "transformers":
            raise TokenizerError("tokenizer engine 'transformers' needs transformers: "
                                 "pip install 'prefix-router[exact]'") from None
        return None, "tokenizer.json", (
            f"tokenizer_config.json names tokenizer_class {cls!r}: transformers (which vLLM "
            "loads tokenizers with) builds that class's own pipeline, which can tokenise "
            "differently from tokenizer.json; install the transformers version of your vLLM "
            "image (pip install 'prefix-router[exact]') to tokenise exactly as it does")
    try:
        loaded = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
        backend = loaded.backend_tokenizer
    except Exception as exc:
        raise TokenizerError(f"transformers cannot load the tokenizer in {directory!r}: "
                             f"{exc}") from exc
    return backend, f"transformers {transformers.__version__} ({type(loaded).__name__})", ""


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` library.

    ``engine``: "auto" (default) tokenises as vLLM does: the file itself, or, for a
    ``tokenizer_class`` transformers rebuilds, the pipeline transformers builds
    (:func:`vllm_pipeline`; ``source`` names which, ``fidelity`` warns when transformers was
    needed and missing); "file": always the file as written; "transformers": always
    transformers' pipeline.

    ``add_special_tokens`` defaults to False because vLLM renders chat prompts with the template
    (which already writes BOS) and tokenises them without adding special tokens again; like
    vLLM's tokenizer it never truncates or pads (settings in the file are turned off).

    ``incremental`` (default): encodings go through :class:`.incremental.IncrementalEncoder`,
    which reuses the tokens of recently encoded texts sharing a prefix and is token-for-token
    the library's ``encode`` (``cache_tokens`` bounds its memory); False: every text is encoded
    whole by the library, as before.
    """

    def __init__(self, path: str, add_special_tokens: bool = False, incremental: bool = True,
                 cache_tokens: int | None = None, engine: str = "auto") -> None:
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise TokenizerError(
                "--tokenizer needs the optional 'tokenizers' package: "
                "pip install 'prefix-router[tokenizers]'"
            ) from exc
        if engine not in ENGINES:
            raise TokenizerError(f"tokenizer engine must be one of {', '.join(ENGINES)}, "
                                 f"got {engine!r}")
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        # what vLLM's transformers builds from this directory (see `vllm_pipeline`); the file
        # itself is parsed only when that is the file as written
        built, self.source, self.fidelity = (None, "tokenizer.json", "") if engine == "file" \
            else vllm_pipeline(os.path.dirname(os.path.abspath(file)), engine)
        if built is not None:
            self._tok = built
        else:
            try:
                self._tok = _HF.from_file(file)
            except Exception as exc:
                raise TokenizerError(f"cannot load tokenizer {file!r}: {exc}") from exc
        self._tok.no_truncation()
        self._tok.no_padding()
        self.name = f"hf:{os.path.basename(os.path.dirname(os.path.abspath(file))) or file}"
        self.path = file
        self.add_special_tokens = add_special_tokens
        self._specials: tuple[tuple[int, ...], tuple[int, ...]] | bool | None = False
        self.incremental: IncrementalEncoder | None = None
        if incremental:
            from templates_audit.incremental import DEFAULT_CACHE_TOKENS, IncrementalEncoder

            self.incremental = IncrementalEncoder(
                self._tok, add_special_tokens=add_special_tokens,
                cache_tokens=DEFAULT_CACHE_TOKENS if cache_tokens is None else cache_tokens)

    def special_tokens(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(before, after): the ids vLLM 0.32.0's tokenizer puts around a text it encodes with
        ``add_special_tokens=True`` (a completions prompt: BOS for a Llama-style tokenizer);
        None when the post-processor does more than add tokens around the text.

        vLLM loads the tokenizer with transformers' ``AutoTokenizer`` (5.19 in its CPU build;
        ``TokenizersBackend`` for a ``tokenizer.json``): it drops ``add_bos_token`` /
        ``add_eos_token`` from ``tokenizer_config.json`` whenever a ``tokenizer.json`` exists
        and keeps that file's post-processor as it is (none: nothing is added). So the ids are
        those the file's post-processor adds, read off one probe encoding. Computed once."""
        found = self._specials
        if found is False:
            # encodings that already carry them (add_special_tokens=True) get none added again
            found = self._specials = ((), ()) if self.add_special_tokens else \
                self._special_tokens()
        return found  # type: ignore[return-value]

    def _special_tokens(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        plain = list(self._tok.encode(_PROBE, add_special_tokens=False).ids)
        full = list(self._tok.encode(_PROBE, add_special_tokens=True).ids)
        n = len(plain)
        for i in range(len(full) - n + 1):
            if full[i:i + n] == plain:
                return tuple(full[:i]), tuple(full[i + n:])
        return None

    def _encode(self, text: str) -> Any:
        try:
            return self._tok.encode(text, add_special_tokens=self.add_special_tokens)
        except TypeError as exc:  # tokenizers: "TextInputSequence must be str"
            raise _encode_error(text, exc) from None

    def encoded(self, text: str) -> Encoded:
        """``text``'s :class:`.incremental.Encoded` (ids, offsets, cached block hashes)."""
        if self.incremental is None:
            from templates_audit.incremental import Encoded

            enc = self._encode(text)
            starts = array("i", [start for start, _ in enc.offsets])
            return Encoded(text, list(enc.ids), starts, array("i"), b"")
        try:
            return self.incremental.encode(text)
        except TypeError as exc:
            raise _encode_error(text, exc) from None

    def encode(self, text: str) -> list[int]:
        if self.incremental is None:
            return list(self._encode(text).ids)
        return list(self.encoded(text).ids)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        if self.incremental is None:
            enc = self._encode(text)
            return list(enc.ids), [start for start, _ in enc.offsets]
        e = self.encoded(text)
        return list(e.ids), e.starts.tolist()

    def fallback(self) -> str:
        """Why prompts are encoded whole rather than spliced ("" when splicing is on): the
        tokenizer's rules prove no cut (:func:`.tokenizer_rules.analyse`, level 0), or a safety
        check found a splice that disagreed with the library and turned splicing off."""
        inc = self.incremental
        if inc is None:
            return ""
        if inc.disabled:
            return inc.disabled
        if inc.rules.level == 0:
            return f"no cut of this tokenizer ({inc.rules.family}) is proven: {inc.rules.reason}"
        return ""

    def chat_template(self) -> str | None:
        """The chat template from a ``tokenizer_config.json`` next to the tokenizer, if any."""
        cfg = os.path.join(os.path.dirname(self.path), "tokenizer_config.json")
        try:
            with open(cfg, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return None
        tmpl = data.get("chat_template")
        if isinstance(tmpl, list):  # named templates: pick "default"
            for item in tmpl:
                if isinstance(item, dict) and item.get("name") == "default":
                    return str(item.get("template"))
            return None
        return tmpl if isinstance(tmpl, str) else None


_PROBE = "probe text 1"  # any text; special_tokens finds its plain encoding inside the full one


def _encode_error(text: str, exc: Exception) -> EncodeError:
    bad = next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)
    why = f"a lone surrogate at character {bad}" if bad is not None else str(exc)
    return EncodeError(f"the tokenizer cannot encode the text ({why})")


_DEFAULT = DefaultTokenizer()


def default_tokenizer() -> DefaultTokenizer:
    return _DEFAULT


def load_tokenizer(path: str | None = None, *, incremental: bool = True) -> Tokenizer:
    """``None`` -> the default tokenizer; otherwise a ``tokenizer.json`` file or its directory
    (``incremental``: see :class:`HFTokenizer`)."""
    if path is None or path == "default":
        return _DEFAULT
    if not os.path.exists(path):
        raise TokenizerError(f"tokenizer not found: {path}")
    return HFTokenizer(path, incremental=incremental)
