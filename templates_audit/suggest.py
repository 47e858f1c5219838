"""Fix suggestions and redaction for findings — pure string functions, one rule per kind.

``suggestion`` names the span by its static lead-in (``Current date: …``) so the reader can find
it in the prompt source, and states the gain in tokens. ``redact`` keeps a value's kind and shape
but not its content: digits -> ``#``, letters -> ``x``/``X``, names -> first letter + ``***``,
emails -> ``a***@***.com``, secrets -> ``***``.
"""

from __future__ import annotations

import re

from templates_audit.model import Role

__all__ = ["lead_in", "redact", "suggestion", "variant_suggestion"]

_LEAD = re.compile(r"[^\n.!?]{0,48}$")


def lead_in(before: str) -> str:
    """The few static words right before a span (same line/sentence), for naming it."""
    m = _LEAD.search(before)
    return (m.group() if m else "").lstrip()


def _where(role: Role) -> str:
    if role is Role.TOOLS:
        return "out of the tool definitions (pass it in the user turn)"
    if role is Role.PROMPT:
        return "to the end of the prompt"
    return "to the end of the system message or into the user turn"


def _gain(tokens_lost: float, what: str = "static tokens after it") -> str:
    gain = round(tokens_lost)
    return (f"; the {gain:,} {what} become cacheable" if gain > 0
            else "; it costs less than one KV block today, but keep volatile values last")


def suggestion(kind: str, role: Role, before: str, tokens_lost: float) -> str:
    tail = _gain(tokens_lost)
    name = f"`{lead_in(before)}…`" if lead_in(before) else "the volatile value"
    if kind == "secret":
        return ("remove credentials from prompts — they leak into logs and caches; "
                "pass them to tools server-side" + tail)
    if kind == "reordered_block" and role in (Role.USER, Role.ASSISTANT):
        return ("send the few-shot example turns in one fixed order (shuffle them once, not per "
                "request)" + _gain(tokens_lost, "tokens of examples"))
    from_it = _gain(tokens_lost, "static tokens from it on")  # the block itself is fixed too
    if kind == "reordered_block" and role is Role.TOOLS:
        return "send the tools in one fixed order (e.g. sorted by name)" + from_it
    if kind == "reordered_block":
        return "sort the examples (or other repeated blocks) deterministically" + from_it
    if kind == "sampled_block":
        return ("fix the set and order of examples (pick them once, not per request)"
                + from_it)
    if kind == "whitespace":
        return "normalise whitespace (strip/collapse) before rendering" + from_it
    if role is Role.TEMPLATE:
        return (f"the chat template injects {name} ({kind}) on every request: pass a fixed value "
                "(e.g. `date_string`) or override the template so the date goes after the "
                "static part" + tail)
    if kind in ("timestamp", "time"):
        precision = "; round it to the day if the model only needs the date"
        return f"move {name} {_where(role)}{precision}" + tail
    if kind in ("uuid", "hex_id", "numeric_id"):
        return f"move the per-request id {name} {_where(role)} (or into request metadata)" + tail
    return f"move {name} {_where(role)}" + tail


def variant_suggestion(values: int, role: Role, before: str, tokens_lost: float) -> str:
    """A low-cardinality slot: fine as it is while its values stay few."""
    name = f"`{lead_in(before)}…`" if lead_in(before) else "it"
    return (f"a variant with {values} values: each is its own cached prefix ({values} cold "
            f"prefills of ~{round(tokens_lost):,} tokens per replica, not one per request); "
            f"keep it if the values stay few, else move {name} {_where(role)}")


_NAME_KINDS = frozenset({"name"})


def redact(value: str, kind: str) -> str:
    """Mask ``value`` keeping its kind and shape (``2024-05-20`` -> ``####-##-##``)."""
    if kind == "secret":
        return "***"
    if kind in _NAME_KINDS:
        return " ".join((w[:1] + "***") if w else w for w in value.split(" "))
    if kind == "email":
        local, _, domain = value.partition("@")
        tld = domain.rsplit(".", 1)[-1] if "." in domain else ""
        return f"{local[:1]}***@***.{tld}" if tld else "***"
    out = []
    for c in value:
        if c.isdigit():
            out.append("#")
        elif c.isalpha():
            out.append("X" if c.isupper() else "x")
        else:
            out.append(c)
    return "".join(out)
