"""The mixed-model benchmark's pure parts: its traffic and its page."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from loadtest.bench_models import MIX, markdown, mixed_requests


def test_mixed_requests_follow_the_mix_in_arrival_order() -> None:
    reqs = mixed_requests(200, 10.0, seed=0)
    models = Counter(r.body["model"] for r in reqs)
    assert models == {m: round(200 * share) for m, share in MIX}
    assert [r.idx for r in reqs] == list(range(len(reqs)))
    assert all(a.at <= b.at for a, b in pairwise(reqs))
    assert all(r.group.startswith(r.body["model"] + "/") for r in reqs)
    assert mixed_requests(200, 10.0, seed=0) == reqs  # the same requests for every setup


def test_page_has_a_row_per_setup_and_the_404_rate() -> None:
    ttft = {"p50": 0.1, "p99": 0.5}
    row = {"setup": "nginx", "sent": 10, "ok": 7, "not_found": 3, "errors": {}, "hit_rate": 0.5,
           "ttft": ttft, "ttft_by_model": {m: ttft for m, _ in MIX}, "load_max_over_mean": 1.2}
    meta = {"date": "d", "machine": "m", "commit": "c", "wall": 1.0, "requests": 10, "rate": 2.0,
            "params": {"kv_blocks": 768, "block_size": 16}}
    page = markdown([row, {"setup": "router-x", "failed": "missing"}], meta)
    assert "| nginx | 10 | 7 | 3 (30 %) | 50.0% | 100 | 500 |" in page
    assert "| router-x | failed: missing |" in page
