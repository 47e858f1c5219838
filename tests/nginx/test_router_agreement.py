"""The router with `routing.ring: nginx` and nginx rendered from the same settings send every
header-keyed request to the same replica."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.app import create_app
from tests.conftest import ThreadedServer
from tests.nginx.harness import nginx_fleet, placements, ring_parity_setup

pytestmark = pytest.mark.nginx


def test_router_with_nginx_ring_and_nginx_agree_on_every_key(tmp_path: Path) -> None:
    keys = [f"agree-{i}" for i in range(400)]
    with nginx_fleet(tmp_path / "backends", [2, 1, 1, 3]) as replicas:
        settings, nginx = ring_parity_setup(tmp_path / "front", replicas)
        try:
            with ThreadedServer(create_app(settings)) as router:
                via_router = placements(router.port, keys)
            via_nginx = placements(nginx.port, keys)
        finally:
            nginx.stop()
    assert {k for k in keys if via_router[k] != via_nginx[k]} == set()
    assert len(set(via_nginx.values())) == 4
