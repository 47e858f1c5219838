"""`prefix-loadtest`: one console script, one subcommand per module, imported lazily.

`SUBCOMMANDS` maps a subcommand to the module implementing it; that module provides
``add_arguments(parser)`` and ``main(args) -> int``. Only the module of the subcommand being run
is imported, so a heavy or missing module never slows down or breaks the others: a subcommand
whose module is not there yet answers "not available yet" (exit 2) instead of crashing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Subcommand:
    module: str
    help: str


SUBCOMMANDS: dict[str, Subcommand] = {
    "replica": Subcommand("loadtest.replica.process", "run one simulated vLLM replica"),
    "fleet": Subcommand("loadtest.fleet", "run N simulated replicas (one process each)"),
    "demo": Subcommand("loadtest.demo", "the quick start: the router in front of 4 simulated "
                       "replicas (`make run`)"),
    "run": Subcommand("loadtest.runner", "drive a workload against a router or replicas"),
    "compare": Subcommand("loadtest.compare", "compare routers on the same workload"),
    "overhead": Subcommand("loadtest.overhead", "measure the router's per-request overhead"),
    "goodput": Subcommand("loadtest.goodput", "the highest request rate each setup serves "
                          "within a TTFT SLO"),
    "simulate": Subcommand("loadtest.simulate", "discrete-event simulation of a routed fleet"),
}


class NotAvailable(Exception):
    pass


def load(name: str) -> ModuleType:
    spec = SUBCOMMANDS[name]
    try:
        module = importlib.import_module(spec.module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and spec.module.startswith(exc.name):
            raise NotAvailable(f"{spec.module} is not there") from exc
        raise
    if not (hasattr(module, "add_arguments") and hasattr(module, "main")):
        raise NotAvailable(f"{spec.module} has no add_arguments/main")
    return module


def build_parser(chosen: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefix-loadtest",
        description="Load-test kit: simulated vLLM replicas and fleets, workloads, comparisons.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, spec in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=spec.help, description=spec.help,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        if name == chosen:
            module = load(name)
            module.add_arguments(p)
            p.set_defaults(run=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    chosen = args_in[0] if args_in and args_in[0] in SUBCOMMANDS else None
    try:
        parser = build_parser(chosen)
    except NotAvailable as exc:
        print(f"prefix-loadtest {chosen}: not available yet ({exc})", file=sys.stderr)
        return 2
    args = parser.parse_args(args_in)
    return int(args.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
