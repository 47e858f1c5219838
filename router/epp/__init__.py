"""The endpoint picker (EPP) of the Gateway API Inference Extension: this router's decisions
inside an Envoy-based gateway, over Envoy's ext_proc gRPC protocol (`prefix-router epp`).

    wire      the protocol's messages, read and built (pure)
    exchange  one ext_proc stream: messages in, answers out; the decision is ``serve``'s own
    outcome   the request's attempt, learned from the response phase (index, counters, health)
    service   the grpc.aio ExternalProcessor servicer and the readiness of grpc.health.v1
    server    the process: the router core's lifespan plus the gRPC server

Needs the ``epp`` extra (grpcio, grpcio-health-checking, xds-protos); nothing outside this
package imports it, so ``serve`` runs without.
"""

__all__: list[str] = []
