"""Value objects of an audit: templates, findings, the report (JSON schema v1 maps 1:1 onto these).

Everything here is frozen and carries no behaviour beyond derived properties, so renderers can be
pure functions of a :class:`Report`. A finding's identity (:attr:`Finding.id`) is stable for a
given trace: template id + token position + kind — the same trace audited twice yields the same
ids, which lets CI diff two reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "SCHEMA_VERSION",
    "BadLine",
    "Finding",
    "Report",
    "Role",
    "Summary",
    "Template",
]

SCHEMA_VERSION = 1


class Role(StrEnum):
    """Where a volatile span sits. Values are API (JSON ``role``)."""

    SYSTEM = "system"
    DEVELOPER = "developer"
    TOOLS = "tools"
    USER = "user"
    ASSISTANT = "assistant"
    PROMPT = "prompt"  # completions request: the raw prompt
    TEMPLATE = "template"  # injected by the chat template itself (e.g. strftime_now)


@dataclass(frozen=True)
class BadLine:
    """An input line that was skipped; ``line`` is 1-based."""

    file: str
    line: int
    error: str


@dataclass(frozen=True)
class Finding:
    """One volatile span of one template that breaks the shared prefix.

    ``first_token``/``block`` locate the span in the template's reference prompt;
    ``tokens_lost_per_request`` is the static tokens after it (block granularity) that would be
    cached if the span moved after the static part. ``examples`` are values as they appear in the
    prompt (already masked when the report was built with redaction). ``before``/``after`` are a
    little static context either side, for highlighting.
    """

    template: str
    kind: str
    role: Role
    first_token: int
    block: int
    requests_affected: int
    distinct_values: int
    examples: tuple[str, ...]
    tokens_lost_per_request: float
    suggestion: str
    before: str = ""
    after: str = ""
    distinct_values_capped: bool = False
    char_start: int = 0  # the span in the template's reference prompt (characters)
    char_end: int = 0

    @property
    def id(self) -> str:
        return f"{self.template}:{self.first_token}:{self.kind}"

    @property
    def security(self) -> bool:
        """Secrets are also a security finding, whatever they cost in cache hits."""
        return self.kind == "secret"


@dataclass(frozen=True)
class Template:
    """A group of requests that would share their static prefix if their volatile values agreed."""

    id: str
    requests: int
    shared_prefix_tokens: int  # where the prefix shared by all its requests ends
    static_tokens: int  # length of the static part (system/developer/tools) of the reference
    example_prefix: str  # the start of the reference's static part
    reference: str = ""  # "file:line" of the request the template's spans are located in


@dataclass(frozen=True)
class Summary:
    requests: int
    bad_lines: int
    templates: int
    block_size: int
    observed_hit_rate: float
    achievable_hit_rate: float
    prompt_tokens: int = 0
    tokenizer: str = "default"
    first_timestamp: float | None = None
    last_timestamp: float | None = None
    templates_dropped: int = 0  # single-request templates not listed (Auditor.max_templates)


@dataclass(frozen=True)
class Report:
    summary: Summary
    templates: tuple[Template, ...] = ()
    findings: tuple[Finding, ...] = ()
    bad_line_samples: tuple[BadLine, ...] = field(default=())

    @property
    def security_findings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.security)
