"""``prefix-audit FILE [FILE...]``: audit request traces for prefix-cache breakers.

Wiring only: parse arguments, build tokenizer/renderer, stream :mod:`.traces` into an
:class:`~templates_audit.analysis.Auditor`, print one renderer's output. Exit codes: 0 ok;
1 the observed hit rate is below ``--fail-under``; 2 usage or input errors (bad option, no
readable file, chat template or tokenizer that cannot be loaded, zero valid requests).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Sequence

from templates_audit.analysis import DEFAULT_CACHE_BLOCKS, MAX_TEMPLATES, Auditor
from templates_audit.model import Report
from templates_audit.progress import Progress
from templates_audit.render import ChatRenderer, TemplateError
from templates_audit.report import json_report, markdown, text
from templates_audit.tokenize import TokenizerError, load_tokenizer
from templates_audit.traces import DEFAULT_MAX_LINE_BYTES, iter_trace, total_bytes

__all__ = ["main"]

EXIT_OK, EXIT_BELOW_THRESHOLD, EXIT_USAGE = 0, 1, 2


def _rate(value: str) -> float:
    try:
        rate = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a rate like 0.6 or 60%, got {value!r}") from None
    if not 0.0 <= rate <= 1.0:
        raise argparse.ArgumentTypeError(f"rate must be within 0..1 (or 0%..100%), got {value!r}")
    return rate


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected an integer > 0, got {value!r}")
    return n


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prefix-audit",
        description="Find volatile values in prompt templates that break vLLM's prefix cache.",
    )
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="JSONL traces (.gz ok, - for stdin): chat/completions bodies, "
                        "{request|body: ...} wrappers or Langfuse-style {input: ...} records")
    p.add_argument("--chat-template", metavar="FILE",
                   help="Jinja chat template (or tokenizer_config.json); default ChatML, or the "
                        "template next to --tokenizer")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="HF tokenizer.json (or its directory); needs the 'tokenizers' extra")
    p.add_argument("--full-encode", action="store_true",
                   help="with --tokenizer: encode every prompt whole instead of reusing the "
                        "tokens of earlier prompts (same report, much slower: a cross-check)")
    p.add_argument("--block-size", type=_positive, default=16, help="KV block size (default 16)")
    p.add_argument("--cache-blocks", type=int, default=DEFAULT_CACHE_BLOCKS,
                   help=f"KV blocks of the simulated replica (default {DEFAULT_CACHE_BLOCKS:,}; "
                        "0 = unbounded, memory then grows with the trace)")
    p.add_argument("--max-templates", type=int, default=MAX_TEMPLATES,
                   help=f"templates kept (default {MAX_TEMPLATES:,}); beyond, the oldest that "
                        "have a single request are dropped from the report (counted in "
                        "templates_dropped) to bound memory; 0 = unbounded")
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    p.add_argument("--redact", action="store_true",
                   help="mask example values, keeping their shape (2024-05-20 -> ####-##-##)")
    p.add_argument("--color", dest="color", action="store_true", default=None,
                   help="ANSI colour (default: when stdout is a TTY)")
    p.add_argument("--no-color", dest="color", action="store_false")
    p.add_argument("--fail-under", type=_rate, metavar="RATE",
                   help="exit 1 if the observed hit rate is below RATE (0.6 or 60%%)")
    p.add_argument("--max-line-bytes", type=_positive, default=DEFAULT_MAX_LINE_BYTES,
                   help="longer lines are skipped and reported (default 16 MiB)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _render(report: Report, fmt: str, color: bool) -> str:
    if fmt == "json":
        return json_report.render(report)
    if fmt == "markdown":
        return markdown.render(report)
    return text.render(report, color=color)


def _emit(report_text: str) -> None:
    """Write the report to stdout. A character the output encoding cannot hold — a lone
    surrogate, which a JSON ``\\ud800`` escape in a trace decodes to — is written as its
    backslash escape (in the JSON report: the JSON escape it came from) instead of failing
    once the whole trace has been read."""
    out = sys.stdout
    if isinstance(out, io.TextIOWrapper):
        out.reconfigure(errors="backslashreplace")
    out.write(report_text)
    out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    for flag in ("cache_blocks", "max_templates"):
        if getattr(args, flag) < 0:
            parser.print_usage(sys.stderr)
            print(f"prefix-audit: --{flag.replace('_', '-')} must be >= 0", file=sys.stderr)
            return EXIT_USAGE
    readable = [f for f in args.files if f == "-" or (os.path.isfile(f) and os.access(f, os.R_OK))]
    if not readable:
        print(f"prefix-audit: no readable input file among {', '.join(args.files)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        tokenizer = load_tokenizer(args.tokenizer, incremental=not args.full_encode)
        if args.chat_template:
            renderer = ChatRenderer.from_file(args.chat_template)
        else:
            bundled = getattr(tokenizer, "chat_template", lambda: None)()
            renderer = ChatRenderer(bundled) if bundled else ChatRenderer()
    except (TokenizerError, TemplateError) as exc:
        print(f"prefix-audit: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if getattr(tokenizer, "fidelity", ""):
        print(f"prefix-audit: warning: {tokenizer.fidelity}", file=sys.stderr)  # type: ignore[attr-defined]

    auditor = Auditor(tokenizer, renderer, block_size=args.block_size,
                      cache_blocks=args.cache_blocks or None, redact_values=args.redact,
                      max_templates=args.max_templates or None)
    progress = Progress(total_bytes(args.files), enabled=False if args.no_progress else None)
    try:
        auditor.add_all(iter_trace(args.files, max_line_bytes=args.max_line_bytes,
                                   on_bytes=progress.advance))
    except KeyboardInterrupt:
        progress.close()
        print("prefix-audit: interrupted; reporting what was read", file=sys.stderr)
    progress.close()
    report = auditor.report()
    why = getattr(tokenizer, "fallback", lambda: "")()
    if why:  # the report is as exact, only slower to get
        print(f"prefix-audit: note: prompts were encoded whole ({why})", file=sys.stderr)

    color = args.color if args.color is not None else (
        sys.stdout.isatty() and "NO_COLOR" not in os.environ)
    _emit(_render(report, args.format, color))
    if report.summary.requests == 0:
        print("prefix-audit: no valid request in the input", file=sys.stderr)
        return EXIT_USAGE
    if args.fail_under is not None and report.summary.observed_hit_rate < args.fail_under:
        print(f"prefix-audit: observed hit rate {report.summary.observed_hit_rate:.3f} is below "
              f"--fail-under {args.fail_under:.3f}", file=sys.stderr)
        return EXIT_BELOW_THRESHOLD
    return EXIT_OK
