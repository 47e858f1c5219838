"""Sharing in-flight routing state between router processes (``routing.peers``).

Each router process computes part of every decision alone: the prefill it has queued on each
replica, the prompts it is prefilling (counted as cached there) and the requests held behind
them. `router.peers.state` mirrors the other processes' in-flight requests into this process's
own routing state (`PeerState.apply`, the one entry point the app and `loadtest.simulate` use);
`router.peers.wire` encodes the events (msgpack, versioned); `router.peers.service` publishes
this process's events on a ZMQ PUB socket and subscribes to its peers'.
"""

from router.peers.state import Outbox, PeerEvent, PeerState

__all__ = ["Outbox", "PeerEvent", "PeerState"]
