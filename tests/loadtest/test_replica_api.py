"""The replica's OpenAI-compatible HTTP API, through the official `openai` client and raw HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from loadtest.replica import Replica, ReplicaConfig
from loadtest.replica.scrape import parse

Start = Callable[..., Any]
HTTP = httpx.Client(timeout=30)  # one client: building one per call costs ~0.1 s (TLS context)


@pytest.fixture
def replica(threaded_server: Start) -> Callable[..., str]:
    def start(**options: Any) -> str:
        options.setdefault("speed", 50.0)
        srv = threaded_server(Replica(ReplicaConfig(name=options.pop("name", "sim-a"),
                                                    **options)))
        return str(srv.url)

    return start


def client(url: str) -> Any:  # Any: the assertions below read optional response fields
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)


MESSAGES = [{"role": "system", "content": "You are a terse assistant. " * 20},
            {"role": "user", "content": "Say something."}]


def test_chat_non_streamed_through_openai_client(replica: Callable[..., str]) -> None:
    c = client(replica())
    first = c.chat.completions.create(model="sim-model", messages=MESSAGES, max_tokens=5)
    raw = c.chat.completions.with_raw_response.create(model="sim-model", messages=MESSAGES,
                                                      max_completion_tokens=7)
    second = raw.parse()
    assert raw.headers["x-replica-name"] == "sim-a"
    assert first.system_fingerprint == "sim-a" and "sim-a" in first.id
    assert first.object == "chat.completion"
    assert first.choices[0].message.role == "assistant"
    assert first.choices[0].finish_reason == "length"
    assert len(first.choices[0].message.content.split()) == 5
    assert first.usage.completion_tokens == 5 and second.usage.completion_tokens == 7
    assert first.usage.prompt_tokens == second.usage.prompt_tokens > 100
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # same prompt again: all its full blocks but the last token's come from the cache
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == (second.usage.prompt_tokens - 1) // 16 * 16 and cached > 0
    # deterministic text for the same prompt
    assert second.choices[0].message.content.startswith(first.choices[0].message.content)


def test_chat_streamed_through_openai_client(replica: Callable[..., str]) -> None:
    c = client(replica())
    chunks = list(c.chat.completions.create(model="sim-model", messages=MESSAGES, max_tokens=4,
                                            stream=True, stream_options={"include_usage": True}))
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [ch.choices[0].delta.content for ch in chunks[1:] if ch.choices]
    assert len(content) == 4 and all(content)
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == "length" and finishes[:-1] == [None] * (len(finishes) - 1)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    assert {ch.system_fingerprint for ch in chunks} == {"sim-a"}


def test_stream_ends_with_done_and_has_no_usage_unless_asked(replica: Callable[..., str]) -> None:
    url = replica()
    r = HTTP.post(url + "/v1/chat/completions", json={
        "messages": MESSAGES, "max_tokens": 3, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    assert '"usage"' not in r.text
    assert len(events) == 1 + 3 + 1  # role chunk, three tokens, [DONE]


def test_completions_with_text_and_token_ids(replica: Callable[..., str]) -> None:
    c = client(replica())
    text = c.completions.create(model="sim-model", prompt="hello " * 50, max_tokens=3)
    assert text.object == "text_completion" and len(text.choices[0].text.split()) == 3
    ids = list(range(40))
    first = c.completions.create(model="sim-model", prompt=ids, max_tokens=2)
    again = c.completions.create(model="sim-model", prompt=ids, max_tokens=2)
    assert first.usage.prompt_tokens == 40
    assert again.usage.prompt_tokens_details.cached_tokens == 32
    streamed = list(c.completions.create(model="sim-model", prompt=ids, max_tokens=2, stream=True))
    assert [ch.choices[0].finish_reason for ch in streamed] == [None, "length"]


def test_default_max_tokens_and_tokenize(replica: Callable[..., str]) -> None:
    url = replica(default_max_tokens=6)
    r = HTTP.post(url + "/v1/completions", json={"prompt": "one two three"}).json()
    assert r["usage"]["completion_tokens"] == 6
    tok = HTTP.post(url + "/tokenize", json={"prompt": "one two three"}).json()
    assert tok["count"] == r["usage"]["prompt_tokens"] == len(tok["tokens"])
    chat_tok = HTTP.post(url + "/tokenize", json={"messages": MESSAGES}).json()
    chat = HTTP.post(url + "/v1/chat/completions", json={"messages": MESSAGES}).json()
    assert chat_tok["count"] == chat["usage"]["prompt_tokens"]


def test_models_health_and_sglang_worker_info(replica: Callable[..., str]) -> None:
    url = replica(model="m1", model_path="/models/m1")
    models = HTTP.get(url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["m1"]
    health = HTTP.get(url + "/health")
    assert health.status_code == 200 and health.headers["x-replica-name"] == "sim-a"
    for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
        assert HTTP.get(url + path).json()["model_path"] == "/models/m1"


@pytest.mark.parametrize(("path", "body", "status"), [
    ("/v1/chat/completions", {"messages": []}, 400),            # no messages
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 0}, 400),
    ("/v1/completions", {"prompt": {"x": 1}}, 400),               # not text nor ids
    ("/v1/completions", {"prompt": "x " * 200, "max_tokens": 5000}, 400),   # > max_model_len
    ("/v1/nothing", {}, 404),
])
def test_bad_requests_get_vllm_error_objects(replica: Callable[..., str], path: str,
                                             body: dict[str, Any], status: int) -> None:
    r = HTTP.post(replica(max_model_len=1024) + path, json=body)
    assert r.status_code == status
    assert r.json()["object"] == "error" and r.json()["code"] == status


def test_api_key_guards_v1_like_vllm(replica: Callable[..., str]) -> None:
    url = replica(api_key="sk-sim")
    assert HTTP.get(url + "/v1/models").status_code == 401
    assert HTTP.get(url + "/v1/models", headers={"authorization": "Bearer nope"}).status_code == 401
    assert HTTP.get(url + "/health").status_code == 200          # only /v1 is guarded
    good: Any = openai.OpenAI(base_url=url + "/v1", api_key="sk-sim", max_retries=0)
    assert good.completions.create(model="sim-model", prompt="hi", max_tokens=1).usage.completion_tokens == 1
    with pytest.raises(openai.AuthenticationError):
        client(url).completions.create(model="sim-model", prompt="hi", max_tokens=1)


def test_public_api_is_pinned() -> None:
    import loadtest.replica

    assert loadtest.replica.__all__ == ["FaultSpec", "Replica", "ReplicaConfig", "scrape", "serve"]


def test_invalid_json_is_400(replica: Callable[..., str]) -> None:
    r = HTTP.post(replica() + "/v1/completions", content=b"{nope")
    assert r.status_code == 400


def test_instant_replica_answers_and_still_counts_hits(replica: Callable[..., str]) -> None:
    url = replica(instant=True)
    c = client(url)
    for _ in range(2):
        c.chat.completions.create(model="sim-model", messages=MESSAGES, max_tokens=3)
    streamed = list(c.chat.completions.create(model="sim-model", messages=MESSAGES, max_tokens=3,
                                              stream=True))
    assert streamed[-1].choices[0].finish_reason == "length"
    m = parse(HTTP.get(url + "/metrics").text)
    assert m["vllm:prefix_cache_hits_total"] > 0
    assert m["sim:requests_total"] == 3


def test_chat_template_file_is_used(replica: Callable[..., str], tmp_path: Any) -> None:
    from templates_audit.tokenize import default_tokenizer

    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    url = replica(chat_template=str(template))
    tok = HTTP.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "hi there"}]})
    assert tok.json()["tokens"] == default_tokenizer().encode("[user] hi there\n")


def test_hf_tokenizer_file_sets_tokens_and_model_path(replica: Callable[..., str],
                                                      tmp_path: Any) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.train_from_iterator(["alpha beta gamma delta"],
                           trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    hf.save(str(path))
    url = replica(tokenizer=str(path))
    tok = HTTP.post(url + "/tokenize", json={"prompt": "alpha beta gamma"}).json()
    assert tok["tokens"] == hf.encode("alpha beta gamma").ids and tok["count"] == 3
    assert HTTP.get(url + "/server_info").json()["model_path"] == str(path.parent)


def test_hf_tokenizer_text_it_cannot_encode_is_a_400(replica: Callable[..., str],
                                                     tmp_path: Any) -> None:
    """A Hugging Face tokenizer takes only valid Unicode: a lone surrogate (a JSON "\\udc00"
    escape) is the client's error, as in vLLM, not a 500."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf = Tokenizer(models.WordLevel({"[UNK]": 0, "alpha": 1}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    url = replica(tokenizer=str(path))
    for route, body in (("/v1/completions", b'{"prompt": "alpha \\udc00", "max_tokens": 2}'),
                        ("/v1/chat/completions",
                         b'{"messages": [{"role": "user", "content": "a \\udc00"}]}'),
                        ("/tokenize", b'{"prompt": "alpha \\udc00"}')):
        r = HTTP.post(url + route, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, (route, r.text)
        assert "lone surrogate" in r.json()["message"]
    assert HTTP.post(url + "/v1/completions", json={"prompt": "alpha", "max_tokens": 2}
                     ).status_code == 200


def test_repeated_body_gives_the_same_answer_and_counts_again(replica: Callable[..., str]) -> None:
    url = replica()
    body = {"messages": MESSAGES, "max_tokens": 4}
    a, b = (HTTP.post(url + "/v1/chat/completions", json=body).json() for _ in range(2))
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    m = parse(HTTP.get(url + "/metrics").text)
    assert m["vllm:prefix_cache_queries_total"] == 2 * a["usage"]["prompt_tokens"]
    assert m["vllm:prefix_cache_hits_total"] == b["usage"]["prompt_tokens_details"]["cached_tokens"]
