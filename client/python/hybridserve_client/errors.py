"""The one exception the client raises for a failed call."""

import grpc


class HybridserveError(Exception):
    """A call failed: the gRPC status the server (or the channel) ended it with.

    Attributes:
      code: grpc.StatusCode, e.g. INVALID_ARGUMENT for a rejected request,
        RESOURCE_EXHAUSTED for no capacity, UNAVAILABLE for a draining or
        unreachable server, DEADLINE_EXCEEDED for the call's timeout,
        CANCELLED when the client cancelled it.
      message: the status details.
      request_id: the Generate request's id, or None for other calls.
    """

    def __init__(self, code, message, request_id=None):
        self.code = code
        self.message = message
        self.request_id = request_id
        super().__init__(code, message, request_id)

    def __str__(self):
        where = " (request %s)" % self.request_id if self.request_id else ""
        return "%s: %s%s" % (self.code.name, self.message, where)


class StreamProtocolError(HybridserveError):
    """A Generate stream broke the contract of proto/generation.proto: it ended
    without its `complete` message, sent a message after it or with neither
    oneof field set, or logprobs not parallel to the tokens. Code INTERNAL:
    the server, not the request, is at fault.
    """

    def __init__(self, message, request_id=None):
        super().__init__(grpc.StatusCode.INTERNAL, message, request_id)


def from_rpc_error(error, request_id=None):
    """Converts a grpc.RpcError (which is also a grpc.Call) to HybridserveError."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return HybridserveError(code, details or "", request_id)
