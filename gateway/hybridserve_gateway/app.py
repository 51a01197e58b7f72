"""The HTTP routes: OpenAI's /v1/chat/completions, /v1/completions and
/v1/models, and /health, /health/live, /metrics.

Request bodies are read here rather than by FastAPI's body parameters, so that
the size limit (413), the read timeout (408), malformed JSON (400) and the
validation errors (400 naming the parameter) all answer in OpenAI's error
shape before anything else runs.
"""

import asyncio
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import errors, service
from .protocol import ChatRequest, CompletionRequest, param_of

_SSE_PING_S = 15  # a comment line on idle streams, so proxies keep them open
_READY_WINDOW_S = 5.0  # ready while some decode answered SERVING this recently


class ClientGone(Exception):
    """The client disconnected before the reply was ready."""


class Gateway:
    """The gateway's state: decode, the model, API keys, settings, draining."""

    def __init__(self, decode, text, metrics, keys=None, *, served_model_name=None, max_body_bytes=4 << 20,
                 body_read_timeout_s=30.0, default_max_tokens=2048):
        self.decode = decode
        self.text = text
        self.metrics = metrics
        self.keys = keys
        self.served_model_name = served_model_name
        self.max_body_bytes = max_body_bytes
        self.body_read_timeout_s = body_read_timeout_s
        self.default_max_tokens = default_max_tokens
        self.model = None  # service.Model once decode answered GetModelInfo
        self.decode_ready = False
        self._last_serving = None  # when decode last answered SERVING
        self._next_model_info_log = 0.0
        self.draining = False
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    # ---- state kept current by main's background loop ----------------------

    async def refresh(self):
        """Model info (until first known), decode's readiness, the keys file."""
        if self.model is None:
            try:
                info = await self.decode.model_info()
                self.model = service.Model(info, self.text, self.served_model_name)
                self._check_vocabulary(info)
                logging.info("serving %s (decode: %s, context %d tokens, end of turn %s)", self.model.name,
                             self.decode.target, info.max_context_tokens, self.model.end_of_turn_ids)
            except Exception as e:  # pylint: disable=broad-except  # decode not up yet: retried
                now = time.monotonic()
                if now >= self._next_model_info_log:  # once, then every 30 s
                    self._next_model_info_log = now + 30.0
                    code = getattr(e, "code", None)  # an AioRpcError's status; else the error itself
                    logging.warning("decode's GetModelInfo failed (%s): retrying every second",
                                    code() if callable(code) else e)
        # Each check reaches one decode pod (round robin): a draining pod's
        # NOT_SERVING must not take the gateway out of its Service while the
        # others serve, so readiness is "some decode answered SERVING within
        # the window", not the last answer alone.
        now = time.monotonic()
        if self.model is not None and await self.decode.ready():
            self._last_serving = now
        self.decode_ready = self._last_serving is not None and now - self._last_serving <= _READY_WINDOW_S
        self.metrics.decode_ready.set(1 if self.decode_ready else 0)
        if self.keys is not None:
            before = self.keys.reloads
            ok = self.keys.check()
            if not ok:
                self.metrics.key_reloads.labels("failed").inc()
            elif self.keys.reloads != before:
                self.metrics.key_reloads.labels("ok").inc()
        await self.decode.reload_if_changed()

    def _check_vocabulary(self, info):
        vocab = getattr(self.text.tokenizer, "vocab_size", None)
        if vocab is not None and vocab > info.vocab_size:
            logging.error("the tokenizer has %d tokens but the model's vocabulary is %d: is --model_dir the "
                          "served model's directory?", vocab, info.vocab_size)

    # ---- request plumbing --------------------------------------------------

    def serving_or_raise(self):
        if self.draining:
            raise errors.ApiError(503, "the gateway is shutting down; retry on another replica", code="draining")
        if self.model is None:
            raise errors.ApiError(503, "decode has not answered yet; retry shortly", code="decode_unavailable")

    def tenant_of(self, request):
        """The request's tenant from its API key (401 when keys are configured
        and the key is missing or unknown); "" without keys."""
        if self.keys is None:
            return ""
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            self.metrics.auth_failures.inc()
            raise errors.ApiError(401, "You didn't provide an API key. Send it as `Authorization: Bearer <key>`.",
                                  type="invalid_request_error", code="missing_api_key")
        tenant = self.keys.tenant_of(key)
        if tenant is None:
            self.metrics.auth_failures.inc()
            raise errors.ApiError(401, "Incorrect API key provided.", type="invalid_request_error",
                                  code="invalid_api_key")
        return tenant

    async def read_json(self, request):
        length = request.headers.get("content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                raise errors.invalid("Content-Length is not a number") from None
            if declared > self.max_body_bytes:
                raise errors.ApiError(413, "the request body is %d bytes; the limit is %d" %
                                      (declared, self.max_body_bytes), code="request_too_large")

        async def read():
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise errors.ApiError(413, "the request body is over the %d-byte limit" % self.max_body_bytes,
                                          code="request_too_large")
                chunks.append(chunk)
            return b"".join(chunks)

        try:
            async with asyncio.timeout(self.body_read_timeout_s):  # no task of its own, unlike wait_for
                raw = await read()
        except TimeoutError:
            raise errors.ApiError(408, "the request body did not arrive within %g s" % self.body_read_timeout_s,
                                  code="request_timeout") from None
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise errors.invalid("the request body is not valid JSON: %s" % e, code="invalid_json") from None
        if not isinstance(body, dict):
            raise errors.invalid("the request body must be a JSON object", code="invalid_json")
        return body

    def begin(self):
        self.in_flight += 1
        self.idle.clear()
        self.metrics.in_flight.set(self.in_flight)

    def end(self):
        self.in_flight -= 1
        self.metrics.in_flight.set(self.in_flight)
        if self.in_flight == 0:
            self.idle.set()

    async def generate(self, request, kind):
        endpoint = "chat" if kind == "chat" else "completions"
        started = time.monotonic()
        status = 200
        handed_off = False  # a stream ends (and counts itself) in its generator
        self.begin()
        try:
            self.serving_or_raise()
            tenant = self.tenant_of(request)
            raw = await self.read_json(request)
            model_cls = ChatRequest if kind == "chat" else CompletionRequest
            try:
                body = model_cls.model_validate(raw)
            except ValidationError as e:
                first = e.errors()[0]
                raise errors.invalid("%s: %s" % (param_of(first["loc"]) or "body", first["msg"]),
                                     param=param_of(first["loc"])) from None
            prepared = service.prepare(kind, body, self.model, self.default_max_tokens)
            include_usage = body.include_usage()
            run = service.Run(self.decode, prepared, tenant, self.model, self.metrics)
            await self._until_disconnect(request, run, run.start())
            if body.stream:
                handed_off = True
                return EventSourceResponse(self._sse(run, include_usage, endpoint, started), sep="\n",
                                           ping=_SSE_PING_S, headers={"x-request-id": prepared.id})
            result = await self._until_disconnect(request, run, service.collect(run))
            return JSONResponse(result, headers={"x-request-id": prepared.id})
        except errors.ApiError as e:
            status = e.status
            return e.response()
        except ClientGone:
            status = 499
            self.metrics.disconnects.inc()
            return Response(status_code=499)
        finally:
            if not handed_off:
                self.metrics.requests.labels(endpoint, str(status)).inc()
                self.metrics.duration.labels(endpoint).observe(time.monotonic() - started)
                self.end()

    async def _sse(self, run, include_usage, endpoint, started):
        finished = False
        try:
            async for event in service.stream(run, include_usage):
                yield event
            finished = True
        finally:
            if not finished:  # the client went away (sse-starlette cancelled us): abort at decode
                run.cancel()
                self.metrics.disconnects.inc()
            self.metrics.requests.labels(endpoint, "200" if finished else "499").inc()
            self.metrics.duration.labels(endpoint).observe(time.monotonic() - started)
            self.end()

    @staticmethod
    async def _until_disconnect(request, run, work):
        """`work`'s result, or ClientGone (and the call cancelled) when the client leaves first."""
        task = asyncio.ensure_future(work)
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            run.cancel()
            raise
        finally:
            watcher.cancel()
        if task in done:
            return task.result()
        task.cancel()
        run.cancel()
        raise ClientGone()


async def _disconnected(request):
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(gateway):
    app = FastAPI(title="hybridserve gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gateway

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, exc):
        return errors.ApiError(exc.status_code, str(exc.detail),
                               type="invalid_request_error" if exc.status_code < 500 else "api_error",
                               code="not_found" if exc.status_code == 404 else None).response()

    @app.exception_handler(Exception)
    async def unexpected(_request, exc):
        logging.exception("unexpected error: %s", exc)
        return errors.ApiError(500, "internal error in the gateway", code="internal_error").response()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await gateway.generate(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await gateway.generate(request, "completion")

    @app.get("/v1/models")
    async def models(request: Request):
        try:
            gateway.serving_or_raise()
            gateway.tenant_of(request)
        except errors.ApiError as e:
            gateway.metrics.requests.labels("models", str(e.status)).inc()
            return e.response()
        gateway.metrics.requests.labels("models", "200").inc()
        model = gateway.model
        return {"object": "list", "data": [{"id": model.name, "object": "model", "created": model.created,
                                            "owned_by": "hybridserve", "max_model_len": model.max_context}]}

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str):
        try:
            gateway.serving_or_raise()
            gateway.tenant_of(request)
            if model_id != gateway.model.name:
                raise errors.ApiError(404, "The model `%s` does not exist" % model_id, param="model",
                                      code="model_not_found")
        except errors.ApiError as e:
            return e.response()
        m = gateway.model
        return {"id": m.name, "object": "model", "created": m.created, "owned_by": "hybridserve",
                "max_model_len": m.max_context}

    @app.get("/health")
    async def health():
        if gateway.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not gateway.decode_ready:
            return JSONResponse({"status": "decode not ready"}, status_code=503)
        return {"status": "ok"}

    @app.get("/health/live")
    async def live():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
