"""Shared machinery of the fresh trace generators (issue 34): gen_fresh_a, gen_fresh_b, gen_fresh_c.

Only these three generators use this module; it shares nothing with the older generators.

What it provides:

- ``rng_for(seed, *labels)``: an independent ``random.Random`` per purpose, seeded from a string
  (``random`` hashes string seeds with SHA-512, so streams are the same on every run and
  platform). Adding a family never shifts the values of another.
- Procedural value pools (``ValuePools``): person names, e-mail addresses, city-like place names,
  product codenames and pseudo-words are assembled from syllables and roots chosen by the
  generator, so every generator has its own population and no list is copied from anywhere.
- ``Users``: a population with Zipf-like activity, so a user sends several requests and values
  recur the way they do in a production trace.
- ``Msg``: a message-content builder that keeps literal text and injected values apart. Each
  injected value is recorded on its ``Field`` together with the literal text right before and
  right after it (bounded, and never crossing another injected value), which is what
  ``scripts/eval_fresh.py`` uses to locate a finding. The builder checks that this surrounding
  text is the same in every request: the location of a field is static by construction.
- ``Trace``: collects requests with a position in time, interleaves the turns of conversations,
  optionally stamps ISO timestamps, and writes ``traces.jsonl`` plus ``truth.json``.

Truth format (``truth.json``)::

    {"generator": "gen_fresh_a", "seed": 101, "requests": 3000,
     "audit_args": ["--chat-template", "<dir>/chat_template.jinja"],   # [] on the default template
     "families": [{"name", "count", "static", "conversations", "fields": [
         {"name", "kind", "also_ok": [...], "role", "before", "after",
          "values": [...distinct injected values...], "distinct", "requests"}]}],
     "request_families": ["<family of line 1>", "<family of line 2>", ...]}

Cost: everything is linear in the number of requests; 3,000 requests take well under a second
plus JSON encoding.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
S = TypeVar("S")

KINDS = frozenset({"timestamp", "date", "time", "uuid", "hex_id", "numeric_id", "name", "email",
                   "secret", "reordered_block", "sampled_block", "other"})
CONTEXT_CHARS = 48


def rng_for(seed: int, *labels: object) -> random.Random:
    """A generator of its own for ``labels`` under ``seed`` (stable across runs)."""
    return random.Random(":".join(str(x) for x in (seed, *labels)))


def digits(rng: random.Random, n: int) -> str:
    """``n`` decimal digits, the first one not zero."""
    return str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(n - 1))


def hex_string(rng: random.Random, n: int) -> str:
    """``n`` lowercase hex digits containing at least one letter and one digit."""
    while True:
        s = "".join(rng.choice("0123456789abcdef") for _ in range(n))
        if any(c.isalpha() for c in s) and any(c.isdigit() for c in s):
            return s


def uuid_string(rng: random.Random) -> str:
    """A version-4 shaped UUID from ``rng``."""
    h = hex_string(rng, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{rng.choice('89ab')}{h[17:20]}-{h[20:]}"


def split_counts(total: int, weights: Sequence[float]) -> list[int]:
    """Integers proportional to ``weights`` summing to ``total`` (largest remainders)."""
    s = sum(weights)
    raw = [total * w / s for w in weights]
    out = [int(x) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def sample_shuffled(rng: random.Random, pool: Sequence[T], k: int) -> list[T]:
    """``k`` distinct items of ``pool`` in a random order."""
    return rng.sample(list(pool), k)


class ValuePools:
    """Procedural values. Each generator passes its own syllables and roots."""

    def __init__(self, rng: random.Random, *, given: Sequence[str], surname_roots: Sequence[str],
                 surname_tails: Sequence[str], place_heads: Sequence[str],
                 place_tails: Sequence[str], code_left: Sequence[str],
                 code_right: Sequence[str], syllables: Sequence[str],
                 mail_domains: Sequence[str]) -> None:
        self.rng = rng
        self.given, self.surname_roots, self.surname_tails = given, surname_roots, surname_tails
        self.place_heads, self.place_tails = place_heads, place_tails
        self.code_left, self.code_right = code_left, code_right
        self.syllables, self.mail_domains = syllables, mail_domains

    def person(self) -> tuple[str, str]:
        """(given name, surname); the surname is a root plus a tail, capitalised."""
        sur = self.rng.choice(self.surname_roots) + self.rng.choice(self.surname_tails)
        return self.rng.choice(self.given), sur.capitalize()

    def email(self, given: str, surname: str) -> str:
        sep = self.rng.choice([".", "_", ""])
        user = f"{given}{sep}{surname}".lower()
        if self.rng.random() < 0.3:
            user += str(self.rng.randint(2, 99))
        return f"{user}@{self.rng.choice(self.mail_domains)}"

    def place(self) -> str:
        return (self.rng.choice(self.place_heads) + self.rng.choice(self.place_tails)).capitalize()

    def codename(self) -> str:
        return f"{self.rng.choice(self.code_left)} {self.rng.choice(self.code_right)}"

    def word(self, n_syllables: int | None = None) -> str:
        n = n_syllables or self.rng.randint(2, 3)
        return "".join(self.rng.choice(self.syllables) for _ in range(n))

    def distinct(self, make: Callable[[], str], n: int) -> list[str]:
        """``n`` distinct values from ``make`` (gives up widening after many collisions)."""
        seen: dict[str, None] = {}
        for _ in range(n * 50):
            seen.setdefault(make(), None)
            if len(seen) == n:
                break
        return list(seen)


class Users:
    """``n`` users with Zipf-like activity (weight 1/(rank+1)^0.8); ``make(i)`` builds user i."""

    def __init__(self, rng: random.Random, n: int, make: Callable[[int], dict[str, Any]]) -> None:
        self.rng = rng
        self.users = [make(i) for i in range(n)]
        weights = [1.0 / (i + 1) ** 0.8 for i in range(n)]
        self.cum = list(itertools.accumulate(weights))

    def pick(self) -> dict[str, Any]:
        x = self.rng.random() * self.cum[-1]
        return self.users[min(bisect.bisect_left(self.cum, x), len(self.users) - 1)]


def prose(rng: random.Random, frames: Sequence[str], slots: Mapping[str, Sequence[str]],
          n_chars: int, *, per_paragraph: tuple[int, int] = (3, 6),
          bullet: str = "", numbered: str = "") -> str:
    """Static text of about ``n_chars`` characters: sentences from ``frames`` with ``{slot}``
    filled from ``slots``, grouped in paragraphs (or bullets: ``bullet`` prefix per sentence,
    or ``numbered`` = a format with ``{n}``)."""
    paragraphs: list[str] = []
    size, n = 0, 0
    while size < n_chars:
        sentences = []
        for _ in range(rng.randint(*per_paragraph)):
            frame = rng.choice(frames)
            s = frame.format_map({k: rng.choice(v) for k, v in slots.items()})
            s = s[0].upper() + s[1:]
            if s[-1] not in ".!?:":
                s += "."
            n += 1
            if numbered:
                s = numbered.format(n=n) + s
            elif bullet:
                s = bullet + s
            sentences.append(s)
        sep = "\n" if (bullet or numbered) else " "
        para = sep.join(sentences)
        paragraphs.append(para)
        size += len(para) + 2
    return "\n\n".join(paragraphs)


@dataclass
class Field:
    """One injected volatile field of a family, as written to truth.json."""

    name: str
    kind: str
    role: str
    also_ok: tuple[str, ...] = ()
    before: str | None = None
    after: str | None = None
    values: set[str] = field(default_factory=set)
    requests: int = 0

    def __post_init__(self) -> None:
        bad = {self.kind, *self.also_ok} - KINDS
        if bad:
            raise ValueError(f"unknown kind(s) {sorted(bad)} for field {self.name}")

    def note(self, values: str | Iterable[str], *, before: str | None = None,
             after: str | None = None) -> None:
        """Record one request's value(s); ``before``/``after`` must not change between calls."""
        vals = [values] if isinstance(values, str) else list(values)
        self.values.update(vals)
        self.requests += 1
        for attr, text in (("before", before), ("after", after)):
            if text is None:
                continue
            old = getattr(self, attr)
            if old is None:
                setattr(self, attr, text)
            elif old != text:
                raise AssertionError(f"{self.name}: {attr} text is not static: {old!r} != {text!r}")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "also_ok": list(self.also_ok),
                "role": self.role, "before": self.before, "after": self.after,
                "values": sorted(self.values), "distinct": len(self.values),
                "requests": self.requests}


@dataclass
class Family:
    name: str
    fields: list[Field] = field(default_factory=list)
    count: int = 0
    conversations: int = 0

    def field(self, name: str, kind: str, role: str, also_ok: Sequence[str] = ()) -> Field:
        f = Field(name, kind, role, tuple(also_ok))
        self.fields.append(f)
        return f

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "count": self.count, "static": not self.fields,
                "conversations": self.conversations,
                "fields": [f.to_json() for f in self.fields]}


class Msg:
    """Builds one message's text; ``val``/``block`` record the value on its field together with
    the literal text around it (at most ``CONTEXT_CHARS``, never crossing another value)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0
        self._spans: list[tuple[Field, list[str], int, int]] = []  # field, values, start, end

    def lit(self, text: str) -> Msg:
        self.parts.append(text)
        self.size += len(text)
        return self

    def _put(self, f: Field, values: list[str], text: str) -> Msg:
        start = self.size
        self.lit(text)
        self._spans.append((f, values, start, self.size))
        return self

    def val(self, f: Field, value: str) -> Msg:
        return self._put(f, [value], value)

    def block(self, f: Field, items: Sequence[str], sep: str) -> Msg:
        return self._put(f, list(items), sep.join(items))

    def done(self) -> str:
        text = "".join(self.parts)
        bounds = [(0, 0), *[(s, e) for _, _, s, e in self._spans], (len(text), len(text))]
        for i, (f, values, start, end) in enumerate(self._spans, start=1):
            prev_end, next_start = bounds[i - 1][1], bounds[i + 1][0]
            f.note(values, before=text[max(prev_end, start - CONTEXT_CHARS):start],
                   after=text[end:min(next_start, end + CONTEXT_CHARS)])
        return text


@dataclass
class Request:
    when: float
    family: str
    body: dict[str, Any]


class Trace:
    """Requests of every family, ordered by time when written."""

    def __init__(self, generator: str, seed: int) -> None:
        self.generator, self.seed = generator, seed
        self.families: list[Family] = []
        self.requests: list[Request] = []

    def family(self, name: str) -> Family:
        fam = Family(name)
        self.families.append(fam)
        return fam

    def add(self, fam: Family, body: dict[str, Any], when: float) -> None:
        fam.count += 1
        self.requests.append(Request(when, fam.name, body))

    def ordered(self) -> list[Request]:
        return sorted(self.requests, key=lambda r: r.when)

    def stamp(self, start: datetime, days: int, *, key: str = "timestamp",
              epoch_ms: bool = False) -> list[tuple[Request, datetime]]:
        """Order the requests and give each a time: ``days`` consecutive days, 09:00-15:00 UTC
        (so a date formatted in any time zone within 8 hours of UTC is the same day), written
        as ``body[key]``: ISO 8601 (``...Z``) or epoch milliseconds."""
        reqs = self.ordered()
        n = len(reqs)
        day_of = [i * days // max(n, 1) for i in range(n)]
        first = {d: day_of.index(d) for d in set(day_of)}
        size = {d: day_of.count(d) for d in set(day_of)}
        out = []
        for i, r in enumerate(reqs):
            d = day_of[i]
            secs = (i - first[d]) * 6 * 3600 // size[d]
            t = start + timedelta(days=d, hours=9, seconds=secs)
            r.body[key] = int(t.timestamp() * 1000) if epoch_ms else t.strftime("%Y-%m-%dT%H:%M:%SZ")
            out.append((r, t))
        return out

    def write(self, out: Path, audit_args: Sequence[str] = ()) -> None:
        out.mkdir(parents=True, exist_ok=True)
        reqs = self.ordered()
        with (out / "traces.jsonl").open("w", encoding="utf-8") as fh:
            for r in reqs:
                fh.write(json.dumps(r.body, ensure_ascii=False, separators=(",", ":")) + "\n")
        truth = {"generator": self.generator, "seed": self.seed, "requests": len(reqs),
                 "audit_args": list(audit_args),
                 "families": [f.to_json() for f in self.families],
                 "request_families": [r.family for r in reqs]}
        (out / "truth.json").write_text(json.dumps(truth, ensure_ascii=False, indent=1) + "\n",
                                        encoding="utf-8")


def conversation_times(rng: random.Random, n_requests: int, turns: tuple[int, int]
                       ) -> list[tuple[int, int, float]]:
    """Split ``n_requests`` into conversations of ``turns`` (min, max) requests: a list of
    (conversation index, turn index, time in [0, 1)) whose turns are in time order."""
    out: list[tuple[int, int, float]] = []
    conv = 0
    left = n_requests
    while left > 0:
        k = min(left, rng.randint(*turns))
        t = rng.random() * 0.97
        for turn in range(k):
            out.append((conv, turn, min(t, 0.999999)))
            t += rng.uniform(0.0005, 0.006)
        left -= k
        conv += 1
    return out


def drive(trace: Trace, fam: Family, rng: random.Random, n: int, turns: tuple[int, int],
          open_conv: Callable[[int], S], request: Callable[[S, int], dict[str, Any]]) -> None:
    """``n`` requests of ``fam`` in conversations of ``turns`` (min, max) requests.

    ``open_conv(i)`` builds conversation i's state (its system prompt, tools...); a field noted
    while it runs is carried by every turn of that conversation, so its ``requests`` count grows
    by one per later turn. ``request(state, turn)`` returns the body of one turn (a later turn
    resends the history of the earlier ones)."""
    states: dict[int, tuple[S, list[Field]]] = {}
    for conv, turn, when in conversation_times(rng, n, turns):
        if conv not in states:
            before = [f.requests for f in fam.fields]
            state = open_conv(conv)
            touched = [f for f, b in zip(fam.fields, before, strict=True) if f.requests > b]
            states[conv] = (state, touched)
            fam.conversations += 1
        else:
            for f in states[conv][1]:
                f.requests += 1
        trace.add(fam, request(states[conv][0], turn), when)


def chat(model: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": messages}
    body.update(extra)
    return body


def parse_args(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--out", type=Path, required=True, help="directory for traces.jsonl, truth.json")
    a = p.parse_args()
    if a.requests < 1:
        p.error("--requests must be >= 1")
    return a


EPOCH = datetime(2026, 3, 2, tzinfo=UTC)
