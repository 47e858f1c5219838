"""Reinstall the distributions whose generated modules xds-protos overwrote.

xds-protos (the `epp` extra: Envoy's protos) also ships old copies of `opentelemetry/proto/...`
and `google/api|rpc|type/...` modules, which replace those of opentelemetry-proto and
googleapis-common-protos when it is installed after them; the OTLP exporter then fails with
``ImportError: cannot import name 'InstrumentationScope'`` (grpc/grpc#42926). This reinstalls,
at the exact installed version and without touching dependencies, every distribution that owns
one of the modules xds-protos also ships, so theirs are on disk again. Envoy's ext_proc modules
do not import the overwritten ones. Nothing to do when xds-protos is not installed.

    python scripts/restore_protos.py       # after `pip install '.[...,epp]'` (make install does)
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys


def shadowed() -> list[str]:
    """``name==version`` of every other distribution sharing a module file with xds-protos."""
    try:
        xds = {str(f) for f in md.distribution("xds-protos").files or ()
               if str(f).endswith(".py") and not str(f).endswith("__init__.py")}
    except md.PackageNotFoundError:
        return []
    out = set()
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name == "xds-protos":
            continue
        if any(str(f) in xds for f in dist.files or ()):
            out.add(f"{name}=={dist.version}")
    return sorted(out)


def main() -> int:
    pins = shadowed()
    if not pins:
        return 0
    print("restoring the modules xds-protos overwrote: " + " ".join(pins), flush=True)
    return subprocess.call([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                            "--force-reinstall", *pins])


if __name__ == "__main__":
    sys.exit(main())
