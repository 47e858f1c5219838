"""The fresh generators (scripts/gen_fresh_{a,b,c}.py, issue 34): deterministic per seed, valid
request lines, a truth.json that agrees with the trace, and chat templates that render the date
they claim to (rendered here with jinja2, and read by prefix-audit without a bad line)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import pytest

ROOT = Path(__file__).resolve().parents[2]
N = 60
ROLES = {"system", "user", "assistant"}


def run(gen: str, seed: int, out: Path) -> tuple[bytes, dict[str, Any]]:
    subprocess.run([sys.executable, str(ROOT / "scripts" / f"gen_fresh_{gen}.py"), "--seed",
                    str(seed), "--requests", str(N), "--out", str(out)], check=True, timeout=120)
    return (out / "traces.jsonl").read_bytes(), json.loads((out / "truth.json").read_text())


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    assert isinstance(content, list) and content, content
    assert all(p["type"] == "text" and isinstance(p["text"], str) for p in content)
    return "\n".join(p["text"] for p in content)


@pytest.fixture(scope="module", params=["a", "b", "c"])
def generated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[str, Path, bytes, dict[str, Any]]:
    out = tmp_path_factory.mktemp(f"gen_{request.param}")
    data, truth = run(request.param, 5, out)
    return request.param, out, data, truth


def test_deterministic_per_seed(generated: tuple[str, Path, bytes, dict[str, Any]],
                                tmp_path: Path) -> None:
    gen, _, data, truth = generated
    again, truth2 = run(gen, 5, tmp_path / "again")
    assert again == data
    strip = lambda t: {k: v for k, v in t.items() if k != "audit_args"}  # noqa: E731 (paths differ)
    assert strip(truth2) == strip(truth)
    other, _ = run(gen, 6, tmp_path / "other")
    assert other != data


def test_lines_are_chat_bodies_and_truth_agrees(
        generated: tuple[str, Path, bytes, dict[str, Any]]) -> None:
    _, _, data, truth = generated
    lines = data.decode("utf-8").splitlines()
    assert len(lines) == N == truth["requests"] == len(truth["request_families"])
    for line in lines:
        body = json.loads(line)
        assert isinstance(body["model"], str) and body["messages"]
        for m in body["messages"]:
            assert m["role"] in ROLES
            content_text(m["content"])
        for tool in body.get("tools", []):
            assert tool["type"] == "function" and tool["function"]["name"]
    fams = truth["families"]
    assert sum(f["count"] for f in fams) == N
    assert len(fams) >= 12 and sum(1 for f in fams if f["static"]) >= 2
    names = {f["name"] for f in fams}
    assert set(truth["request_families"]) == names
    kinds = {x["kind"] for f in fams for x in f["fields"]}
    assert {"name", "numeric_id", "reordered_block", "sampled_block", "other"} <= kinds


def test_every_injected_value_is_in_the_trace(
        generated: tuple[str, Path, bytes, dict[str, Any]]) -> None:
    _, _, data, truth = generated
    text = "\n".join(
        "\n".join(content_text(m["content"]) for m in b["messages"])
        + "\n" + json.dumps(b.get("tools", []))
        for b in map(json.loads, data.decode("utf-8").splitlines()))
    for fam in truth["families"]:
        for fld in fam["fields"]:
            assert fld["values"] and fld["requests"] >= 1, fld["name"]
            if fld["role"] == "template":
                continue                        # written by the chat template: see below
            for v in fld["values"]:
                assert v in text, (fam["name"], fld["name"], v)
            if fld["before"] is not None:       # the location text is there too, with a value
                assert any(fld["before"] + v in text for v in fld["values"]), fld["name"]


def render(template: str, body: dict[str, Any], today: str) -> str:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["strftime_now"] = lambda fmt: today
    return env.from_string(template).render(messages=body["messages"], tools=body.get("tools"),
                                            add_generation_prompt=True)


def test_template_date_is_rendered_where_the_truth_says(
        generated: tuple[str, Path, bytes, dict[str, Any]]) -> None:
    gen, out, data, truth = generated
    dated = [(f["name"], x) for f in truth["families"] for x in f["fields"]
             if x["role"] == "template"]
    if not truth["audit_args"]:
        assert gen == "b" and not dated         # B runs on the default template
        return
    assert truth["audit_args"] == ["--chat-template", str((out / "chat_template.jinja").resolve())]
    template = (out / "chat_template.jinja").read_text()
    (family, fld), = dated
    bodies = [json.loads(x) for x in data.decode("utf-8").splitlines()]
    for body, fam in zip(bodies, truth["request_families"], strict=True):
        prompt = render(template, body, "31 December 1999")
        assert prompt.count("<|") >= 2 * len(body["messages"])   # every message got a header
        for m in body["messages"]:
            assert content_text(m["content"]) in prompt
        marked = fld["before"] + "31 December 1999" + fld["after"] in prompt
        assert marked == (fam == family), fam


def test_prefix_audit_reads_every_line(generated: tuple[str, Path, bytes, dict[str, Any]]) -> None:
    _, out, _, truth = generated
    run_ = subprocess.run([sys.executable, "-m", "templates_audit", str(out / "traces.jsonl"),
                           "--format", "json", "--no-progress", *truth["audit_args"]],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run_.returncode == 0, run_.stderr
    summary = json.loads(run_.stdout)["summary"]
    assert (summary["requests"], summary["bad_lines"]) == (N, 0)
