"""vLLM KV cache events: the wire codec (`wire`), shared by the replica side and the router side.

Only imported when KV events are enabled: it needs the optional extra ``prefix-router[kv]``
(pyzmq, msgpack). docs/kv-events.md describes the format and both sides.
"""

__all__: list[str] = []
