from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from router.metrics import DistinctKeys, RouterMetrics

DOCUMENTED = {
    "prefix_router_requests", "prefix_router_in_flight", "prefix_router_time_to_first_byte_seconds",
    "prefix_router_request_duration_seconds", "prefix_router_retries", "prefix_router_ejections",
    "prefix_router_replica_healthy", "prefix_router_spills", "prefix_router_distinct_keys_per_minute",
    "prefix_router_rejected", "prefix_router_replicas",
}


def samples(m: RouterMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body, ctype = m.render()
    assert ctype.startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_every_documented_family_is_exposed() -> None:
    m = RouterMetrics()
    m.set_membership({"r0": (True, False)})
    m.dispatched("r0")
    m.finished("r0", "home", 200, 0.01, 0.02)
    m.retry("r0", "connect")
    m.ejection("r0", "5xx")
    m.spill("r0")
    m.reject("overloaded")
    m.observe_key("k")
    body, _ = m.render()
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert DOCUMENTED <= names


def test_registries_are_per_app() -> None:
    a, b = RouterMetrics(), RouterMetrics()
    a.dispatched("r0")
    a.finished("r0", "home", 200, None, 0.1)
    sa, sb = samples(a), samples(b)
    key = ("prefix_router_requests_total",
           frozenset({("replica", "r0"), ("branch", "home"), ("status", "200"),
                      ("model", "unknown")}))
    assert sa[key] == 1
    assert key not in sb


def test_in_flight_goes_up_and_down() -> None:
    m = RouterMetrics()
    m.dispatched("r1")
    m.dispatched("r1")
    assert samples(m)[("prefix_router_in_flight", frozenset({("replica", "r1")}))] == 2
    m.finished("r1", "spill", 502, None, 0.5)
    assert samples(m)[("prefix_router_in_flight", frozenset({("replica", "r1")}))] == 1


def test_membership_states_and_departed_replicas() -> None:
    m = RouterMetrics()
    m.set_membership({"a": (True, False), "b": (False, False), "c": (True, True)})
    s = samples(m)
    assert s[("prefix_router_replicas", frozenset({("state", "healthy")}))] == 1
    assert s[("prefix_router_replicas", frozenset({("state", "unhealthy")}))] == 1
    assert s[("prefix_router_replicas", frozenset({("state", "draining")}))] == 1
    assert s[("prefix_router_replica_healthy", frozenset({("replica", "c")}))] == 0
    m.dispatched("b")
    m.set_membership({"a": (True, False)})
    s = samples(m)
    assert ("prefix_router_replica_healthy", frozenset({("replica", "c")})) not in s
    # b still has a request open: its series stays until that request ends
    assert s[("prefix_router_in_flight", frozenset({("replica", "b")}))] == 1
    m.finished("b", "home", 200, None, 0.1)
    m.set_membership({"a": (True, False)})
    assert ("prefix_router_in_flight", frozenset({("replica", "b")})) not in samples(m)


def test_distinct_keys_estimate_is_close() -> None:
    d = DistinctKeys()
    for n in (10, 1000, 20000):
        d = DistinctKeys()
        for i in range(n):
            d.add(f"key-{i}", now=100.0)
            d.add(f"key-{i}", now=101.0)  # repeats do not count
        est = d.estimate(now=102.0)
        assert abs(est - n) / n < 0.1, (n, est)


def test_distinct_keys_slide_out_after_a_minute() -> None:
    d = DistinctKeys()
    for i in range(500):
        d.add(f"old-{i}", now=0.0)
    for i in range(50):
        d.add(f"new-{i}", now=55.0)
    assert d.estimate(now=58.0) > 400  # both windows live
    assert abs(d.estimate(now=65.0) - 50) < 10  # the first sub-window has expired
    assert d.estimate(now=200.0) == 0.0


def test_distinct_keys_gauge_follows_observed_keys() -> None:
    m = RouterMetrics()
    for i in range(300):
        m.observe_key(f"template-{i}")
    v = samples(m)[("prefix_router_distinct_keys_per_minute", frozenset())]
    assert 250 < v < 350


def test_finished_attempts_update_their_series_through_the_cached_children() -> None:
    m = RouterMetrics()
    m.set_membership({"r0": (True, False)})
    for _ in range(2):
        m.dispatched("r0")
    m.finished("r0", "home", 502, None, 0.003, "m")  # no first byte: no TTFB series yet
    got = samples(m)
    ttfb = "prefix_router_time_to_first_byte_seconds_count"
    assert not any(name == ttfb for name, _ in got)
    m.finished("r0", "home", 502, 0.001, 0.004, "m")  # the same labels, now with a first byte
    m.dispatched("r0")
    m.finished("r0", "spill", 200, 0.002, 0.005, "m")  # other labels share the TTFB child
    got = samples(m)
    labels = frozenset({("replica", "r0"), ("model", "m")})
    assert got[(ttfb, labels)] == 2
    assert got[("prefix_router_request_duration_seconds_count",
                frozenset({("replica", "r0")}))] == 3
    assert got[("prefix_router_requests_total", frozenset({
        ("replica", "r0"), ("branch", "home"), ("status", "502"), ("model", "m")}))] == 2
    assert got[("prefix_router_in_flight", frozenset({("replica", "r0")}))] == 0
    m.set_membership({})  # the replica left with nothing open: its rows go with it
    m.dispatched("r0")
    m.finished("r0", "home", 200, 0.001, 0.002, "m")
    assert samples(m)[("prefix_router_in_flight", frozenset({("replica", "r0")}))] == 0


def test_hot_path_updates_render_as_the_prometheus_api_would() -> None:
    """`finished` / `dispatched` / `cached_tokens` update the children through their values
    (`_adder`, `_observer`): the text must be what Gauge.inc/dec, Counter.inc and
    Histogram.observe give for the same calls, bucket edges and +Inf included."""
    from router.metrics import DURATION_BUCKETS, TTFB_BUCKETS
    from router.usage import Usage

    fast, ref = RouterMetrics(), RouterMetrics()
    for m in (fast, ref):
        m.set_membership({"r0": (True, False), "r1": (True, False)})
    amounts = [0.0, 0.0005, *TTFB_BUCKETS, *DURATION_BUCKETS, 0.0123, 7.5, 1e6]
    for i, a in enumerate(amounts):
        replica = f"r{i % 2}"
        ttfb = None if i % 5 == 0 else a
        fast.dispatched(replica)
        fast.finished(replica, "home", 200 if i % 3 else 502, ttfb, a, "m")
        fast.cached_tokens(replica, i, Usage(100 + i, i) if i % 4 else Usage(None, None))
        g = ref.in_flight.labels(replica)
        g.inc()
        g.dec()
        ref.requests.labels(replica, "home", "200" if i % 3 else "502", "m").inc()
        if ttfb is not None:
            ref.ttfb.labels(replica, "m").observe(ttfb)
        ref.duration.labels(replica).observe(a)
        if i:
            ref.predicted_cached.labels(replica).inc(i)
        if i % 4:
            ref.reported_cached.labels(replica).inc(i)
            ref.reported_prompt.labels(replica).inc(100 + i)
        else:
            ref.reported_cached.labels(replica)
            ref.reported_prompt.labels(replica)
    def values(m: RouterMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return {k: v for k, v in samples(m).items() if not k[0].endswith("_created")}

    assert values(fast) == values(ref)
