"""Model pools and LoRA affinity (router.models), /v1/models and lora_requests_info parsing."""

from __future__ import annotations

from typing import Any

import pytest

from router.health import parse_lora_info
from router.models import (
    UNKNOWN,
    ModelPools,
    PoolStatus,
    lora_affinity,
    select_pool,
    served_models,
)
from router.policy import Branch, Decision, LoadBound
from router.replicas import ReplicaState


def rep(name: str, models: str | None, *, up: bool = True, adapters: str = "",
        running: str = "", max_lora: int = 0, load: int = 0) -> ReplicaState:
    """A replica serving ``models`` (comma-separated; None: unknown) whose ``adapters`` (a
    subset) have the first model as parent."""
    names = None if models is None else frozenset(models.split(","))
    base = (models or "").split(",")[0]
    parents = {a: base for a in adapters.split(",") if a}
    return ReplicaState(name, f"http://{name}", healthy=up, in_flight=load, models=names,
                        parents=parents, lora_running=frozenset(filter(None, running.split(","))),
                        max_lora=max_lora)


FLEET = [rep("l0", "llama,sql", adapters="sql"), rep("l1", "llama"), rep("q0", "qwen"),
         rep("q1", "qwen")]


@pytest.mark.parametrize(("states", "model", "status", "members", "label"), [
    (FLEET, "llama", PoolStatus.OK, ["l0", "l1"], "llama"),  # the replicas listing it
    (FLEET, "sql", PoolStatus.OK, ["l0"], "sql"),  # an adapter: only where it is served
    (FLEET, "mistral", PoolStatus.NOT_FOUND, [], UNKNOWN),  # nobody lists it: 404
    (FLEET, None, PoolStatus.BLIND, ["l0", "l1", "q0", "q1"], UNKNOWN),  # no model: anywhere
    (FLEET, 7, PoolStatus.BLIND, ["l0", "l1", "q0", "q1"], UNKNOWN),  # not a string: same
    ([rep("a", None), rep("b", None)], "x", PoolStatus.BLIND, ["a", "b"], UNKNOWN),  # no list yet
    ([rep("a", "llama"), rep("b", None)], "llama", PoolStatus.OK, ["a", "b"], "llama"),  # one model
    ([rep("a", "llama"), rep("b", None)], "x", PoolStatus.NOT_FOUND, [], UNKNOWN),  # one model: 404
    ([rep("a", "llama"), rep("q", "qwen"), rep("b", None)], "llama", PoolStatus.OK, ["a"],
     "llama"),  # several models: an unknown list receives nothing
    ([rep("a", "llama"), rep("q", "qwen"), rep("b", None)], "x", PoolStatus.PENDING, [],
     UNKNOWN),  # ... and a model nobody lists yet may be on it: 503, not 404
    ([rep("a", "llama"), rep("q", "qwen"), rep("b", None, up=False)], "x",
     PoolStatus.NOT_FOUND, [], UNKNOWN),  # the unknown one is down: nothing to wait for
    ([rep("a", "llama", up=False), rep("q", "qwen")], "llama", PoolStatus.DOWN, ["a"],
     "llama"),  # the model's pool is down: 503
    ([rep("a", "llama,sql", adapters="sql"), rep("b", None)], "sql", PoolStatus.OK, ["a"],
     "sql"),  # one base model: unknown lists take the base model, never its adapters
])
def test_select_pool(states: list[ReplicaState], model: Any, status: PoolStatus,
                     members: list[str], label: str) -> None:
    pool = select_pool(model, states)
    assert (pool.status, [s.name for s in pool.members], pool.label) == (status, members, label)


def test_an_adapter_pool_is_marked() -> None:
    assert select_pool("sql", FLEET).adapter and not select_pool("llama", FLEET).adapter


@pytest.mark.parametrize("model", ["llama", "sql", "qwen", "mistral", None, 7])
def test_model_pools_answer_as_select_pool(model: Any) -> None:
    pools = ModelPools()
    for _ in range(2):  # the second answer comes from the remembered catalog
        assert pools.select(model, FLEET) == select_pool(model, FLEET)


def members(pools: ModelPools, model: str, states: list[ReplicaState]) -> tuple[str, list[str]]:
    pool = pools.select(model, states)
    return pool.status.value, [s.name for s in pool.members]


def test_model_pools_follow_every_change() -> None:
    a, b = rep("a", "llama"), rep("b", "qwen")
    fleet = [a, b]
    pools = ModelPools()
    assert members(pools, "llama", fleet) == ("ok", ["a"])
    b.models = frozenset({"qwen", "llama"})  # a list learned again: b now serves llama too
    assert members(pools, "llama", fleet) == ("ok", ["a", "b"])
    a.healthy = b.healthy = False  # availability is read per call, not remembered
    assert members(pools, "llama", fleet) == ("down", ["a", "b"])
    a.healthy = True
    c = rep("c", "mistral")
    assert members(pools, "mistral", [*fleet, c]) == ("ok", ["c"])  # a replica joined
    assert members(pools, "mistral", fleet)[0] == "not_found"  # ... and left again
    b.parents = {"llama": "qwen"}  # llama became an adapter of qwen on b
    assert pools.select("llama", fleet).adapter
    assert members(pools, "llama", [b, a]) == ("ok", ["b", "a"])  # same replicas, new order
    assert members(pools, "mistral", fleet)[0] == "not_found"
    fleet.append(c)  # the same list object, grown in place
    assert members(pools, "mistral", fleet) == ("ok", ["c"])


BOUND = LoadBound(1.25, 0)


def decide(states: list[ReplicaState], chosen: str) -> Decision:
    order = [s.name for s in states]
    return Decision(chosen, Branch.HOME, (chosen, *(n for n in order if n != chosen)), chosen)


@pytest.mark.parametrize(("states", "chosen", "expected", "branch"), [
    # the chosen replica has the adapter running: kept
    ([rep("a", "m", running="x", max_lora=1), rep("b", "m", max_lora=1)], "a", "a", Branch.HOME),
    # another one has it: moved there
    ([rep("a", "m", max_lora=2), rep("b", "m", running="x", max_lora=2)], "a", "b",
     Branch.LORA_AFFINITY),
    # nobody has it; the chosen one is full (would swap), another has a free slot: moved
    ([rep("a", "m", running="y", max_lora=1), rep("b", "m", max_lora=1)], "a", "b",
     Branch.LORA_AFFINITY),
    # nobody has it, the chosen one has a free slot: kept
    ([rep("a", "m", max_lora=1), rep("b", "m", max_lora=1)], "a", "a", Branch.HOME),
    # everyone is full: a swap is unavoidable, the policy's choice stands
    ([rep("a", "m", running="y", max_lora=1), rep("b", "m", running="z", max_lora=1)], "a", "a",
     Branch.HOME),
    # the replica holding it is over the cap: not used; the free one under the cap is
    ([rep("a", "m", running="y", max_lora=1, load=4), rep("b", "m", running="x", max_lora=1,
                                                          load=40),
      rep("c", "m", max_lora=1, load=4)], "a", "c", Branch.LORA_AFFINITY),
    # only full replicas are under the cap: the full one is used after all
    ([rep("a", "m", running="y", max_lora=1, load=2), rep("b", "m", max_lora=1, load=40)], "a",
     "a", Branch.HOME),
    # no LoRA information (metrics off): counts as a free slot, nothing moves
    ([rep("a", "m"), rep("b", "m")], "a", "a", Branch.HOME),
])
def test_lora_affinity(states: list[ReplicaState], chosen: str, expected: str,
                       branch: Branch) -> None:
    d = lora_affinity("x", decide(states, chosen), states, BOUND)
    assert (d.replica, d.branch) == (expected, branch)
    assert d.candidates[0] == d.replica and sorted(d.candidates) == sorted(s.name for s in states)


def test_lora_affinity_prefers_the_decisions_own_order() -> None:
    states = [rep(n, "m", running="x", max_lora=1) for n in ("a", "b", "c")]
    states[0] = rep("a", "m", max_lora=1, running="y")
    d = Decision("a", Branch.SPILL, ("a", "c", "b"), "a")
    assert lora_affinity("x", d, states, BOUND).replica == "c"  # c comes before b there


VLLM_MODELS = {"object": "list", "data": [  # vLLM 0.32 with --lora-modules sql=...
    {"id": "tiny-llama", "object": "model", "root": "/m", "parent": None, "max_model_len": 2048},
    {"id": "sql", "object": "model", "root": "/a/sql", "parent": "tiny-llama",
     "max_model_len": None}]}


@pytest.mark.parametrize(("listing", "names", "parents"), [
    (VLLM_MODELS, {"tiny-llama", "sql"}, {"sql": "tiny-llama"}),
    ({"data": [{"id": "a"}, {"id": ""}, {"no": "id"}, "x", {"id": 3}]}, {"a"}, {}),
    ({"data": [{"id": "a", "parent": "a"}]}, {"a"}, {}),  # its own parent is no parent
])
def test_served_models(listing: Any, names: set[str], parents: dict[str, str]) -> None:
    served = served_models(listing)
    assert served is not None and (set(served.names), dict(served.parents)) == (names, parents)


@pytest.mark.parametrize("listing", [None, [], {"data": "x"}, {"object": "list"}, "text"])
def test_served_models_rejects_what_is_not_a_list(listing: Any) -> None:
    assert served_models(listing) is None


def test_lora_info_is_the_latest_label_set() -> None:
    # a real vLLM 0.32 scrape holds every label set it ever set; the newest has the largest value
    text = ('# TYPE vllm:lora_requests_info gauge\n'
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",'
            'waiting_lora_adapters="sql"} 1.7961570446430893e+09\n'
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",'
            'waiting_lora_adapters=""} 1.7961570446542807e+09\n'
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",'
            'waiting_lora_adapters=""} 1.79615704e+09\n')
    info = parse_lora_info(text)
    assert info is not None
    assert (set(info.running), set(info.waiting), info.max_lora) == ({"sql", "chat"}, set(), 2)
    assert parse_lora_info("vllm:num_requests_running 1\n") is None
    assert parse_lora_info('vllm:lora_requests_info{max_lora="x"} nan?\n') is None


def test_probes_learn_models_and_a_fixed_list_gains_only_its_adapters(
        threaded_server: Any) -> None:
    import asyncio

    import aiohttp

    from loadtest.replica import Replica, ReplicaConfig
    from router.discovery import Endpoint
    from router.health import HealthMonitor
    from router.metrics import RouterMetrics
    from router.replicas import ReplicaSet
    from router.settings import HealthSettings, ScrapeSettings, Settings

    url = threaded_server(Replica(ReplicaConfig(model="llama", lora=("sql",), instant=True))).url
    rs = ReplicaSet([Endpoint("learned", url), Endpoint("fixed", url, models=("llama",)),
                     Endpoint("wrong", url, models=("qwen",))])
    monitor = HealthMonitor(HealthSettings(), ScrapeSettings(), rs, RouterMetrics())

    async def learn() -> list[bool]:
        async with aiohttp.ClientSession() as session:
            return [await monitor.learn_models(session, r) for r in rs.states()]

    before = {s.name: s.models for s in rs.states()}
    assert before == {"learned": None, "fixed": {"llama"}, "wrong": {"qwen"}}
    assert asyncio.run(learn()) == [True, True, True]  # each learned something (parents too)
    assert asyncio.run(learn()) == [False, False, False]  # nothing new the second time
    got = {s.name: (s.models, dict(s.parents)) for s in rs.states()}
    assert got["learned"] == ({"llama", "sql"}, {"sql": "llama"})
    assert got["fixed"][0] == {"llama", "sql"}  # the adapter of a fixed base model joins
    assert got["wrong"][0] == {"qwen"}  # config wins: nothing of llama's is added
    assert Settings.from_dict({"replicas": [{"name": "a", "url": "http://a:1",
                                             "models": ["llama"]}]}).replicas[0].models == ("llama",)
