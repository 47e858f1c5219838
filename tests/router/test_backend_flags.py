"""`--backend` values (`serve` and `nginx-config`): every form and its replicas[] entry."""

from __future__ import annotations

import re

import pytest

from router.settings import Settings, SettingsError, parse_backend


@pytest.mark.parametrize(("text", "entry"), [
    ("http://10.0.0.1:8000", {"name": "r3", "url": "http://10.0.0.1:8000"}),  # unnamed: r<index>
    ("a=http://10.0.0.1:8000", {"name": "a", "url": "http://10.0.0.1:8000"}),
    ("http://10.0.0.1:8000=4", {"name": "r3", "url": "http://10.0.0.1:8000", "weight": 4}),
    ("vllm-0=http://10.0.0.1:8000=2", {"name": "vllm-0", "url": "http://10.0.0.1:8000",
                                       "weight": 2}),
    ("https://h.example", {"name": "r3", "url": "https://h.example"}),
])  # fmt: skip
def test_forms(text: str, entry: dict[str, object]) -> None:
    assert parse_backend(text, 3) == entry


@pytest.mark.parametrize(("text", "message"), [
    ("a=b=c=d", "--backend: expected [NAME=]URL[=WEIGHT], got 'a=b=c=d'"),
    ("http://h:1=heavy", "--backend: weight must be an integer, got 'http://h:1=heavy'"),
    ("a=http://h:1=x", "--backend: weight must be an integer"),
])  # fmt: skip
def test_malformed_values_name_the_flag(text: str, message: str) -> None:
    with pytest.raises(SettingsError, match="^" + re.escape(message)):
        parse_backend(text, 0)


def test_overrides_build_the_replicas_a_yaml_file_would() -> None:
    s = Settings().with_overrides(backends=["a=http://h1:8000=2", "http://h2:8000"])
    assert [(r.name, r.url, r.weight) for r in s.replicas] == [
        ("a", "http://h1:8000", 2), ("r1", "http://h2:8000", 1)]
    assert s.discovery.type == "static"
    # the quick start names its replicas itself
    named = Settings().with_overrides(backends=["http://h1:8000"], names=["sim-0"])
    assert [r.name for r in named.replicas] == ["sim-0"]
    with pytest.raises(SettingsError, match=r"replicas\[0\].weight"):
        Settings().with_overrides(backends=["http://h1:8000=0"])
