"""The quick start: the router in front of a simulated fleet, from one command.

    prefix-router serve                # no --config, no --backend: this demo
    prefix-loadtest demo [--port 8000] # the same, from the load-test kit (`make run`)

This module is the composition root that may know both layers: the import contracts
(pyproject.toml) let ``loadtest`` import ``router`` but never the other way round, so the
`prefix-router` console script is `router_main` here - ``router.cli.main`` with `simulated_fleet`
plugged in as its ``demo`` - rather than the router reaching for the load-test kit at run time.
Every other `prefix-router` command behaves exactly as ``router.cli.main`` does.

`simulated_fleet` starts `DEMO_REPLICAS` replica processes (`loadtest.fleet.Fleet`) on free
loopback ports and stops them, by PID, when the router exits (Ctrl-C, SIGTERM, or an error).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Sequence

from loadtest.fleet import Fleet
from router import cli as router_cli
from router.settings import Settings

__all__ = ["DEMO_REPLICAS", "DemoFleet", "add_arguments", "main", "router_main",
           "simulated_fleet"]

DEMO_REPLICAS = 4


class DemoFleet:
    """A started `Fleet` as the router's CLI sees a demo (``router.cli.Demo``)."""

    def __init__(self, fleet: Fleet) -> None:
        self.names: Sequence[str] = list(fleet.names)
        self.urls: Sequence[str] = list(fleet.urls)

    def banner(self, settings: Settings) -> str:
        host = settings.listen.host
        base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{settings.listen.port}"
        names = ", ".join(f"{r.name}={r.url}" for r in settings.replicas)
        return f"""prefix-router quick start: {len(settings.replicas)} simulated vLLM replicas ({names})
router on {base}  (Ctrl-C stops the router and the replicas)

  curl {base}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "sim-model", "messages": [{{"role": "system", "content": "You are a terse \
assistant for the demo fleet. Answer in one line."}}, {{"role": "user", "content": "hello"}}]}}' -i

  python -c "import openai; c = openai.OpenAI(base_url='{base}/v1', api_key='none'); \
print(c.chat.completions.create(model='sim-model', messages=[{{'role': 'user', 'content': 'hi'}}]))"

  curl {base}/metrics | grep prefix_router_requests_total
"""


@contextlib.contextmanager
def simulated_fleet() -> Iterator[DemoFleet]:
    """`DEMO_REPLICAS` simulated replicas for as long as the block runs."""
    with Fleet(replicas=DEMO_REPLICAS) as fleet:
        yield DemoFleet(fleet)


def router_main(argv: Sequence[str] | None = None) -> int:
    """The `prefix-router` console script."""
    return router_cli.main(argv, demo=simulated_fleet)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    router_cli.add_listen_flags(parser)
    parser.set_defaults(config=None, backend=[])


def main(args: argparse.Namespace) -> int:
    """`prefix-loadtest demo`: `prefix-router serve` with the simulated fleet."""
    return router_cli.serve(args, demo=simulated_fleet)
