"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}
with the HTTP status OpenAI's API gives the same failure, and the mapping of
decode's gRPC statuses onto them."""

import grpc
from fastapi.responses import JSONResponse


class ApiError(Exception):
    """A request's failure as the client sees it."""

    def __init__(self, status, message, *, type=None, param=None, code=None):  # pylint: disable=redefined-builtin
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES.get(status, "api_error")
        self.param = param
        self.code = code

    def body(self):
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers=None):
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


def invalid(message, param=None, code=None):
    return ApiError(400, message, param=param, code=code)


def unsupported(param, message):
    """A parameter OpenAI defines that this server does not implement (400 naming it)."""
    return ApiError(400, message, param=param, code="unsupported_parameter")


# decode's refusals (proto/generation.proto: INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
# UNAVAILABLE while draining) and the rest, as HTTP statuses.
_GRPC_TO_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, None),
    grpc.StatusCode.OUT_OF_RANGE: (400, None),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "server_busy"),
    grpc.StatusCode.UNAVAILABLE: (503, "decode_unavailable"),
    # decode cancelled the call itself (its drain's grace ran out, a restart): retryable.
    grpc.StatusCode.CANCELLED: (503, "decode_cancelled"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout"),
    # The gateway's own identity refused at decode: its deployment, not the client, is wrong.
    grpc.StatusCode.PERMISSION_DENIED: (502, "upstream_refused_gateway"),
    grpc.StatusCode.UNAUTHENTICATED: (502, "upstream_refused_gateway"),
    grpc.StatusCode.UNIMPLEMENTED: (502, "upstream_unimplemented"),
}


def from_rpc_error(error):
    """An ApiError for a failed decode call (grpc.aio.AioRpcError)."""
    code = error.code()
    status, err_code = _GRPC_TO_HTTP.get(code, (500, "internal_error"))
    details = error.details() or code.name
    if status == 429:
        message = "decode is at capacity: %s (retry later)" % details
    elif status == 503:
        message = "decode is unavailable (%s): %s; retry" % (code.name, details)
    elif status >= 500:
        message = "decode call failed (%s): %s" % (code.name, details)
    else:
        message = details
    err = ApiError(status, message, code=err_code)
    if status == 400:
        err.param = _param_of(details)
    return err


# decode names the field it refused (GenerateRequest's names); the OpenAI parameter behind it.
_FIELD_TO_PARAM = [
    ("max_tokens", "max_tokens"),
    ("prompt_token_ids", "prompt"),
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("top_logprobs", "top_logprobs"),
    ("cache_salt", "user"),
    ("stop_token_ids", "stop"),
]


def _param_of(details):
    for field, param in _FIELD_TO_PARAM:
        if field in details:
            return param
    return None
