"""The Dockerfile's structure: slim base, runtime dependencies only, a non-root user matching
the Deployment, the documented entrypoint, a health check, and a tight build context."""

from __future__ import annotations

import fnmatch
import json
import shlex
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            op, _, args = pending.strip().partition(" ")
            out.append((op.upper(), args.strip()))
            pending = ""
    return out


def final_stage() -> list[tuple[str, str]]:
    ins = instructions()
    start = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    return ins[start:]


def test_base_images_are_python_311_slim() -> None:
    froms = [args.split()[0] for op, args in instructions() if op == "FROM"]
    assert froms and all(f == "python:3.11-slim" for f in froms)


def test_runs_as_the_non_root_user_the_deployment_expects() -> None:
    users = [args for op, args in final_stage() if op == "USER"]
    assert users, "final stage has no USER"
    uid = users[-1].split(":")[0]
    assert uid not in ("root", "0")
    deployment = yaml.safe_load((ROOT / "deploy/base/deployment.yaml").read_text())
    assert int(uid) == deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"]


def test_installs_runtime_dependencies_only() -> None:
    installs = [args for op, args in instructions() if op == "RUN" and "pip install" in args]
    assert len(installs) == 1
    words = shlex.split(installs[0].split("&&")[0])
    target = words[words.index("install") + 1]
    assert target in (".", ".[kubernetes]", ".[kubernetes,otel]", ".[kubernetes,otel,kv]",
                      ".[kubernetes,otel,kv,epp]")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"][
        "optional-dependencies"]
    assert all(dep.startswith("lightkube") for dep in extras.get("kubernetes", []))
    assert all(dep.startswith("opentelemetry-") for dep in extras.get("otel", []))
    assert all(dep.startswith(("pyzmq", "msgpack")) for dep in extras.get("kv", []))
    assert all(dep.startswith(("grpcio", "xds-protos")) for dep in extras.get("epp", []))
    for word in ("dev", "test", "pytest", "ruff", "mypy", "-e"):
        assert word not in words
    # the final stage copies the built venv; no pip, compilers or sources are carried over
    assert not [a for op, a in final_stage() if op == "RUN" and "pip" in a]
    copies = [a for op, a in final_stage() if op == "COPY"]
    assert any(a.startswith("--from=build /opt/venv") for a in copies)


def test_entrypoint_cmd_and_healthcheck() -> None:
    final = dict(final_stage())
    assert json.loads(final["ENTRYPOINT"]) == ["prefix-router", "serve"]
    assert json.loads(final["CMD"]) == ["--config", "/etc/prefix-router/router.yaml"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["scripts"]
    # router.cli.main with the quick-start demo plugged in (docs/architecture.md, "Layers")
    assert scripts["prefix-router"] == "loadtest.demo:router_main"
    assert "/health" in final["HEALTHCHECK"]
    assert "8000" in final.get("EXPOSE", "")


def dockerignore_allows(path: str) -> bool:
    allowed = True
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        hit = (fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/")
               or (pattern.startswith("**/") and fnmatch.fnmatch(path.split("/")[-1],
                                                                 pattern[3:])))
        if pattern == "**" or hit:
            allowed = negate
    return allowed


def test_build_context_holds_only_what_the_build_copies() -> None:
    sources = []
    for op, args in instructions():
        if op == "COPY" and not args.startswith("--from"):
            sources += args.split()[:-1]
    assert sources
    for src in sources:
        assert dockerignore_allows(src.rstrip("/")), f"{src} is excluded by .dockerignore"
    for path in ("tests/conftest.py", ".git/config", "router/__pycache__/app.cpython-311.pyc",
                 "docs/architecture.md", "deploy/examples/vllm/router.yaml", ".venv/bin/python"):
        assert not dockerignore_allows(path), path
    for path in ("router/app.py", "loadtest/replica/server.py", "pyproject.toml"):
        assert dockerignore_allows(path), path


def test_copied_sources_exist() -> None:
    for op, args in instructions():
        if op == "COPY" and not args.startswith("--from"):
            for src in args.split()[:-1]:
                assert (ROOT / src).exists(), f"COPY {src}: missing from the repository"
