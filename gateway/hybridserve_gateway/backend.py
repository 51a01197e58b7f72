"""decode's Generation service over grpc.aio: the model's info, readiness, and
Generate streams carrying the tenant as a trusted proxy.

With mutual TLS (--tls_ca/--tls_cert/--tls_key) the gateway proves its own
identity to decode and names each request's tenant in the
x-hybridserve-tenant header, which decode believes only from a connection
whose certificate it lists in --trusted_proxies (docs/ARCHITECTURE.md,
"Trust"). Certificates renewed on disk are picked up: the files are re-read
every few seconds and a change opens a new channel for the calls that follow
(calls in flight finish on the old one, closed after a grace period).
Without TLS no tenant header is sent (decode would refuse it): tenants are
then kept apart by the cache salt alone (service.cache_salt).
"""

import asyncio
import hashlib
import json
import logging

import grpc
from hybridserve_client.proto import generation_pb2 as pb
from hybridserve_client.proto import generation_pb2_grpc as pb_grpc

TENANT_HEADER = "x-hybridserve-tenant"
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_SERVING = b"\x08\x01"  # grpc.health.v1.HealthCheckResponse{status: SERVING}
_OLD_CHANNEL_GRACE_S = 600.0  # calls in flight on a replaced channel get this long
# A Generate call decode refuses before answering anything (UNAVAILABLE: a
# pod draining after SIGTERM, which still holds this channel's connection
# until its server shuts down) is retried by gRPC, on the next address round
# robin picks: another decode pod. gRPC retries only calls not yet committed
# (no response headers or message received), so a stream that began is never
# replayed. 5 attempts, backoffs of up to 0.1, 0.2, 0.4, 0.8 s: also the time
# for a re-resolution when every known address is gone (a fast rollout).
# CANCELLED too: a decode pod whose shutdown grace ran out cancels the calls it
# still holds (seen once in a rollout, before the first token); the gateway's
# own cancellation (its client left) is never retried, gRPC retries only what
# the server answered.
_SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": "hybridserve.v1.Generation"}],
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"]}}]})
# The target is re-resolved when a connection ends (a pod's drain, decode's
# --max_connection_age); gRPC's default spaces re-resolutions 30 s apart,
# longer than a decode pod takes to be replaced in a rollout.
_MIN_RESOLUTION_INTERVAL_MS = 1000


class Decode:
    """One decode target (a Service name or an address list: gRPC balances)."""

    def __init__(self, target, *, tls_ca=None, tls_cert=None, tls_key=None, tls_server_name=None,
                 max_message_bytes=64 << 20):
        if (tls_cert or tls_key or tls_server_name) and not tls_ca:
            raise ValueError("--tls_cert, --tls_key and --tls_server_name need --tls_ca")
        if bool(tls_cert) != bool(tls_key):
            raise ValueError("--tls_cert and --tls_key go together")
        self.target = target
        self.tls = bool(tls_ca)
        self.sends_tenant = bool(tls_cert)  # a proxy's assertion needs the proxy's certificate
        self._files = [p for p in (tls_ca, tls_cert, tls_key) if p]
        self._tls_server_name = tls_server_name
        # Round robin over every address the target resolves to (a headless
        # Service's pods): each request goes to the next decode pod, instead
        # of every request of this gateway to the one pod its first connection
        # reached. Addresses are re-resolved when a connection ends (decode's
        # --max_connection_age), so new pods join within that age.
        self._options = [("grpc.lb_policy_name", "round_robin"),
                         ("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.max_send_message_length", max_message_bytes),
                         # A decode that vanished without a reset (a node lost) is found
                         # by pings during calls; none while idle, which a gRPC server
                         # answers with GOAWAY "too many pings".
                         ("grpc.keepalive_time_ms", 60000),
                         ("grpc.keepalive_timeout_ms", 20000),
                         ("grpc.keepalive_permit_without_calls", 0),
                         ("grpc.enable_retries", 1),
                         ("grpc.service_config", _SERVICE_CONFIG),
                         ("grpc.dns_min_time_between_resolutions_ms", _MIN_RESOLUTION_INTERVAL_MS)]
        if tls_server_name:
            self._options.append(("grpc.ssl_target_name_override", tls_server_name))
        self._files_digest = None
        self._channel = None
        self._stub = None
        self._health = None
        self.channel_reloads = 0
        self._open()

    def _read_files(self):
        return [open(p, "rb").read() for p in self._files]

    def _open(self):
        contents = self._read_files() if self.tls else []
        digest = hashlib.sha256(b"\0".join(contents)).digest()
        if self.tls:
            ca, cert, key = (contents + [None, None])[:3]
            credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
            channel = grpc.aio.secure_channel(self.target, credentials, options=self._options)
        else:
            channel = grpc.aio.insecure_channel(self.target, options=self._options)
        old = self._channel
        self._channel = channel
        self._stub = pb_grpc.GenerationStub(channel)
        self._health = channel.unary_unary(_HEALTH_CHECK)
        self._files_digest = digest
        if old is not None:
            self.channel_reloads += 1
            asyncio.get_running_loop().create_task(old.close(grace=_OLD_CHANNEL_GRACE_S))

    async def reload_if_changed(self):
        """Opens a new channel when the certificate files changed on disk."""
        if not self.tls:
            return False
        try:
            contents = self._read_files()
        except OSError as e:
            logging.error("TLS files unreadable (%s): keeping the current channel", e)
            return False
        if hashlib.sha256(b"\0".join(contents)).digest() == self._files_digest:
            return False
        logging.info("TLS files changed on disk: new connections to decode use them")
        self._open()
        return True

    def metadata(self, tenant):
        return ((TENANT_HEADER, tenant),) if self.sends_tenant else ()

    async def model_info(self, timeout=10.0):
        return await self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout,
                                             metadata=self.metadata("gateway"))

    async def ready(self, timeout=2.0):
        """decode's readiness (grpc.health.v1, service "": NOT_SERVING while it drains)."""
        try:
            reply = await self._health(b"", timeout=timeout)
        except grpc.aio.AioRpcError as e:
            # A Generation server without the health service (not decode): it answered, so it is up.
            return e.code() == grpc.StatusCode.UNIMPLEMENTED
        return reply == _SERVING

    def generate(self, request, tenant):
        """A Generate call (a grpc.aio stream: async-iterate its responses; cancel() ends it)."""
        return self._stub.Generate(request, metadata=self.metadata(tenant))

    async def abort(self, request_id, tenant):
        try:
            await self._stub.Abort(pb.AbortRequest(request_ids=[request_id]), timeout=5.0,
                                   metadata=self.metadata(tenant))
        except grpc.aio.AioRpcError as e:
            logging.warning("Abort(%s) failed: %s", request_id, e.code().name)

    async def close(self):
        if self._channel is not None:
            await self._channel.close()
