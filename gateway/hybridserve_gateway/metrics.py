"""The gateway's Prometheus metrics (GET /metrics), on a registry of its own."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("hybridserve_gateway_requests", "HTTP requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.errors = Counter("hybridserve_gateway_stream_errors",
                              "Streams that ended with an error event after their status line, by HTTP status",
                              ["status"], registry=r)
        self.in_flight = Gauge("hybridserve_gateway_requests_in_flight", "Generation requests in flight",
                               registry=r)
        self.ttft = Histogram("hybridserve_gateway_time_to_first_token_seconds",
                              "From the Generate call to its first token, as the gateway sees it",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("hybridserve_gateway_request_duration_seconds",
                                  "Generation requests from arrival to their last byte", ["endpoint"],
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("hybridserve_gateway_tokens", "Tokens: prompt, completion, and prompt tokens "
                              "decode took from the cache", ["kind"], registry=r)
        self.disconnects = Counter("hybridserve_gateway_client_disconnects",
                                   "Requests whose client went away before the reply ended (aborted at decode)",
                                   registry=r)
        self.auth_failures = Counter("hybridserve_gateway_auth_failures", "Requests refused 401", registry=r)
        self.key_reloads = Counter("hybridserve_gateway_api_key_reloads", "API keys file reloads, by result",
                                   ["result"], registry=r)
        self.draining = Gauge("hybridserve_gateway_draining", "1 while the gateway drains (SIGTERM)", registry=r)
        self.decode_ready = Gauge("hybridserve_gateway_decode_ready", "1 while decode answers its readiness check",
                                  registry=r)
