"""`loadtest.bench_epp` on a small run: every setup answers every request, and the EPP routes
as `serve` does on the same requests (the same fleet hit rate within half a point)."""

from __future__ import annotations

from loadtest.bench_epp import markdown, run


def test_the_epp_routes_like_serve_on_the_same_requests() -> None:
    result = run("multi-turn", 24, 2, seed=3)
    rows = {r["setup"]: r for r in result["rows"]}
    assert list(rows) == ["serve", "epp full_duplex_streamed", "epp buffered",
                          "epp full_duplex_streamed, response headers only",
                          "epp full_duplex_streamed, no response phase",
                          "envoy + epp full_duplex_streamed"]
    assert all(r["failed"] == 0 for r in rows.values())
    serve = rows["serve"]["hit_rate"]
    assert serve > 0.3  # the workload shares prefixes: there is a hit rate to match
    for name in ("epp full_duplex_streamed", "epp buffered",
                 "epp full_duplex_streamed, response headers only",
                 "envoy + epp full_duplex_streamed"):
        assert abs(rows[name]["hit_rate"] - serve) <= 0.005, (name, rows)
    assert "| serve |" in markdown(result)
