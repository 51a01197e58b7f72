"""One OpenAI request through decode: the prompt's ids, the Generate call, the
reply as text (whole, or as chunks for SSE), usage with decode's cached tokens.

A request's life: validated body -> prompt ids (chat template or prompt
text) -> GenerateRequest (sampling, max_tokens, the chat's end-of-turn ids,
the cache salt) -> decode's stream. The first message is awaited before
anything is answered, so a refusal (INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
UNAVAILABLE) is an HTTP status even for a streamed request. Stop strings are
matched on the text; a match aborts the request at decode (Abort, which ends
it within one step) and the stream is read to its `complete` for the usage.
A client that goes away cancels the call, which aborts it at decode.
"""

import asyncio
import hashlib
import json
import time
import uuid

import grpc
from hybridserve_client.proto import generation_pb2 as pb

from . import errors
from .text import StopMatcher

_FINISH = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_ABORT: "abort",
    pb.FINISH_REASON_ERROR: "error",
}


def cache_salt(tenant, user, prompt_cache_key):
    """The decode request's cache salt: requests share cache entries only when
    tenant, user and prompt_cache_key are all equal (the tenant too, so that
    tenants stay apart where decode cannot be told the tenant: no TLS)."""
    if not tenant and not user and not prompt_cache_key:
        return ""
    material = json.dumps([tenant or "", user or "", prompt_cache_key or ""], ensure_ascii=False)
    return "gw:" + hashlib.sha256(material.encode("utf-8")).hexdigest()


class Model:
    """What the gateway knows of the served model (from GetModelInfo) and its text side."""

    def __init__(self, info, text, served_name=None):
        self.info = info
        self.text = text
        self.name = served_name or info.model_name
        self.max_context = info.max_context_tokens
        self.end_of_turn_ids = [t.id for t in info.end_of_turn_tokens] or list(info.eos_token_ids)
        self.created = int(time.time())


class Prepared:
    """A validated request ready for decode."""

    def __init__(self, kind, body, prompt_ids, max_tokens, stop_token_ids, logprobs, top_logprobs):
        self.kind = kind  # "chat" or "completion"
        self.body = body
        self.prompt_ids = prompt_ids
        self.max_tokens = max_tokens
        self.stop_token_ids = stop_token_ids
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())


def prepare(kind, body, model, default_max_tokens):
    """Checks the request against the model and builds its prompt ids."""
    if body.model != model.name:
        raise errors.ApiError(404, "The model `%s` does not exist (this server serves `%s`)" % (body.model, model.name),
                              param="model", code="model_not_found")
    body.check()
    text = model.text
    if kind == "chat":
        try:
            prompt_ids = text.encode_chat(body.template_messages(), tools=body.tools,
                                          template_kwargs=body.chat_template_kwargs)
        except errors.ApiError:
            raise
        except Exception as e:  # pylint: disable=broad-except  # the template's own refusal (raise_exception), a bad kwarg
            raise errors.invalid("the chat template could not render these messages: %s" % e, param="messages")
        stop_ids = list(model.end_of_turn_ids)
        logprobs = bool(body.logprobs)
        top = body.top_logprobs or 0
    else:
        prompt = body.single_prompt()
        if isinstance(prompt, str):
            prompt_ids = text.encode_prompt(prompt)
        else:
            vocab = model.info.vocab_size
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise errors.invalid("prompt token %d is outside the vocabulary [0, %d)" % (bad[0], vocab),
                                     param="prompt")
            prompt_ids = list(prompt)
        stop_ids = []
        logprobs = body.logprobs is not None
        top = body.logprobs or 0
    if not prompt_ids:
        raise errors.invalid("the prompt has no tokens", param="messages" if kind == "chat" else "prompt")
    room = model.max_context - len(prompt_ids)
    if room <= 0:
        raise errors.invalid("the prompt has %d tokens; this model's context is %d tokens" %
                             (len(prompt_ids), model.max_context),
                             param="messages" if kind == "chat" else "prompt", code="context_length_exceeded")
    limit = body.token_limit()
    if limit is None:
        limit = min(default_max_tokens, room)
    elif limit > room:
        name = "max_completion_tokens" if kind == "chat" and body.max_completion_tokens is not None else "max_tokens"
        raise errors.invalid("%s (%d) plus the prompt's %d tokens exceed this model's context of %d tokens" %
                             (name, limit, len(prompt_ids), model.max_context), param=name,
                             code="context_length_exceeded")
    return Prepared(kind, body, prompt_ids, limit, stop_ids, logprobs, top)


def generate_request(p, tenant):
    body = p.body
    sampling = pb.SamplingParams()
    sampling.temperature = 1.0 if body.temperature is None else body.temperature
    if body.top_p is not None:
        sampling.top_p = body.top_p
    if body.top_k is not None and body.top_k > 0:
        sampling.top_k = body.top_k
    if body.seed is not None:
        sampling.seed = body.seed & 0xFFFFFFFFFFFFFFFF
    return pb.GenerateRequest(
        request_id=p.id,
        prompt_token_ids=p.prompt_ids,
        sampling=sampling,
        stop=pb.StopConditions(max_tokens=p.max_tokens, stop_token_ids=p.stop_token_ids,
                               ignore_eos=bool(body.ignore_eos)),
        cache_salt=cache_salt(tenant, body.user, body.prompt_cache_key),
        return_logprobs=p.logprobs,
        top_logprobs=p.top_logprobs,
    )


class Run:
    """One Generate call's reply turned into text pieces.

    events() yields ("delta", text, logprob_entries) as tokens arrive, then
    ("finish", reason, usage). The call is started by start(), which awaits
    its first message so that refusals surface as ApiError before any reply.
    """

    def __init__(self, decode, prepared, tenant, model, metrics):
        self.decode = decode
        self.p = prepared
        self.tenant = tenant
        self.model = model
        self.metrics = metrics
        self.detok = model.text.detokenizer()
        self.stops = StopMatcher(prepared.body.stops())
        self.call = None
        self._first = None
        self.tokens = 0
        self.started = time.monotonic()
        self.first_token_at = None

    async def start(self):
        self.call = self.decode.generate(generate_request(self.p, self.tenant), self.tenant)
        try:
            self._first = await self.call.read()
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e) from None
        if self._first is grpc.aio.EOF:
            raise errors.ApiError(502, "decode ended the stream without a reply", code="upstream_protocol")

    def cancel(self):
        if self.call is not None and not self.call.done():
            self.call.cancel()

    async def events(self):
        """The reply's events. decode's messages are read by a task of their
        own into a queue; each event takes every message queued by then, so a
        gateway that falls behind its streams sends one event for several
        tokens instead of falling further behind (OpenAI's clients take
        deltas of any length)."""
        queue = asyncio.Queue()
        reader = asyncio.get_running_loop().create_task(self._read_into(queue))
        try:
            complete = None
            stopped = False
            batch = [self._first]
            while True:
                pieces, entries, ended = [], [], False
                for message in batch:
                    if message is grpc.aio.EOF:
                        ended = True
                        break
                    if isinstance(message, grpc.aio.AioRpcError):
                        if stopped and message.code() == grpc.StatusCode.CANCELLED:
                            ended = True
                            break
                        raise errors.from_rpc_error(message) from None
                    kind = message.WhichOneof("response")
                    if kind == "chunk":
                        if not stopped:
                            piece, ents, stopped = self._chunk(message.chunk)
                            pieces.append(piece)
                            entries += ents
                            if stopped:
                                # A stop string: end the request at decode; its `complete` still has the usage.
                                asyncio.get_running_loop().create_task(self.decode.abort(self.p.id, self.tenant))
                    elif kind == "complete":
                        complete = message.complete
                text = "".join(pieces)
                if text or entries:
                    yield ("delta", text, entries)
                if ended:
                    break
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
        finally:
            reader.cancel()
        if complete is None and not stopped:
            raise errors.ApiError(502, "decode's stream ended without its final message", code="upstream_protocol")
        if complete is not None and complete.finish_reason == pb.FINISH_REASON_ERROR and not stopped:
            raise errors.ApiError(500, "generation failed: %s" % (complete.error_message or "unknown error"),
                                  code="generation_error")
        if not stopped:
            tail = self.detok.flush()
            released, hit = self.stops.feed(tail)
            if not hit:
                released += self.stops.flush()
            if released:
                yield ("delta", released, [])
            stopped = hit
        reason = "stop" if stopped else _FINISH.get(complete.finish_reason, "stop")
        if reason == "abort":
            reason = "stop"
        yield ("finish", reason, self._usage(complete))

    async def _read_into(self, queue):
        """decode's messages after the first, then EOF, or the call's error, into `queue`."""
        while True:
            try:
                message = await self.call.read()
            except grpc.aio.AioRpcError as e:
                queue.put_nowait(e)
                return
            queue.put_nowait(message)
            if message is grpc.aio.EOF:
                return

    def _chunk(self, chunk):
        ids = list(chunk.token_ids)
        if ids and self.first_token_at is None:
            self.first_token_at = time.monotonic()
            self.metrics.ttft.observe(self.first_token_at - self.started)
        self.tokens += len(ids)
        entries = self._logprobs(chunk) if self.p.logprobs else []
        text = self.detok.decode(ids)
        released, stopped = self.stops.feed(text) if text else ("", False)
        return released, entries, stopped

    def _logprobs(self, chunk):
        text = self.model.text
        entries = []
        for i, token_id in enumerate(chunk.token_ids):
            token, raw = text.token_text(token_id)
            top = []
            if self.p.top_logprobs and i < len(chunk.top_logprobs):
                for alt in chunk.top_logprobs[i].entries:
                    alt_token, alt_raw = text.token_text(alt.token_id)
                    top.append((alt_token, alt.logprob, alt_raw))
            logprob = chunk.logprobs[i] if i < len(chunk.logprobs) else None
            entries.append((token, logprob, raw, top))
        return entries

    def _usage(self, complete):
        prompt = len(self.p.prompt_ids)
        completion = self.tokens
        cached = 0
        if complete is not None and complete.HasField("usage"):
            prompt = complete.usage.prompt_tokens or prompt
            completion = max(complete.usage.completion_tokens, self.tokens)
            cached = complete.usage.cached_tokens
        self.metrics.tokens.labels("prompt").inc(prompt)
        self.metrics.tokens.labels("completion").inc(completion)
        self.metrics.tokens.labels("cached").inc(cached)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}


_compact_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


# ---- OpenAI response shapes -------------------------------------------------

def chat_logprobs(entries):
    return {"content": [{"token": t, "logprob": lp, "bytes": raw,
                         "top_logprobs": [{"token": at, "logprob": alp, "bytes": araw} for at, alp, araw in top]}
                        for t, lp, raw, top in entries], "refusal": None}


class CompletionLogprobs:
    """The legacy completions' logprobs object, with text offsets into the reply."""

    def __init__(self):
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []

    def add(self, entries, offset):
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t, lp, _, top in entries:
            out["tokens"].append(t)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append({at: alp for at, alp, _ in top} if top else None)
            out["text_offset"].append(offset)
            offset += len(t)
        self.tokens += out["tokens"]
        self.token_logprobs += out["token_logprobs"]
        self.top_logprobs += out["top_logprobs"]
        self.text_offset += out["text_offset"]
        return out, offset

    def whole(self):
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top_logprobs,
                "text_offset": self.text_offset}


async def collect(run):
    """A whole (non-streamed) reply: the response object."""
    p = run.p
    pieces = []
    entries = []
    legacy = CompletionLogprobs() if p.kind == "completion" and p.logprobs else None
    offset = 0
    reason, usage = "stop", None
    async for event in run.events():
        if event[0] == "delta":
            _, piece, ents = event
            pieces.append(piece)
            if legacy is not None:
                _, offset = legacy.add(ents, offset)
            else:
                entries += ents
        else:
            _, reason, usage = event
    text = "".join(pieces)
    base = {"id": p.id, "created": p.created, "model": run.model.name,
            "system_fingerprint": run.model.info.fingerprint[:16] or None}
    if p.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                  "logprobs": chat_logprobs(entries) if p.logprobs else None, "finish_reason": reason}
        return dict(base, object="chat.completion", choices=[choice], usage=usage)
    choice = {"index": 0, "text": text, "logprobs": legacy.whole() if legacy is not None else None,
              "finish_reason": reason}
    return dict(base, object="text_completion", choices=[choice], usage=usage)


async def stream(run, include_usage):
    """The SSE events of a streamed reply (each a JSON string; then "[DONE]")."""
    p = run.p
    base = {"id": p.id, "created": p.created, "model": run.model.name,
            "system_fingerprint": run.model.info.fingerprint[:16] or None}
    chat = p.kind == "chat"
    base["object"] = "chat.completion.chunk" if chat else "text_completion"
    dumps = _compact_json
    usage_field = {"usage": None} if include_usage else {}
    # A text-only delta event is the same JSON but for its text: made once, the text put between.
    slot = "\u0000slot\u0000"
    if chat:
        template = dumps(dict(base, choices=[{"index": 0, "delta": {"content": slot}, "logprobs": None,
                                              "finish_reason": None}], **usage_field))
    else:
        template = dumps(dict(base, choices=[{"index": 0, "text": slot, "logprobs": None, "finish_reason": None}],
                              **usage_field))
    head, tail = template.split(dumps(slot))
    legacy = CompletionLogprobs() if not chat and p.logprobs else None
    offset = 0
    if chat:
        yield dumps(dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                          "logprobs": None, "finish_reason": None}], **usage_field))
    try:
        async for event in run.events():
            if event[0] == "delta":
                _, piece, ents = event
                if not ents:
                    yield head + dumps(piece) + tail
                    continue
                if chat:
                    choice = {"index": 0, "delta": {"content": piece},
                              "logprobs": chat_logprobs(ents) if p.logprobs else None, "finish_reason": None}
                else:
                    lp = None
                    if legacy is not None:
                        lp, offset = legacy.add(ents, offset)
                    choice = {"index": 0, "text": piece, "logprobs": lp, "finish_reason": None}
                yield dumps(dict(base, choices=[choice], **usage_field))
            else:
                _, reason, usage = event
                if chat:
                    choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
                else:
                    choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}
                yield dumps(dict(base, choices=[choice], **usage_field))
                if include_usage:
                    yield dumps(dict(base, choices=[], usage=usage))
    except errors.ApiError as e:
        # Mid-stream: the status line is sent; the error travels as an event, as OpenAI's does.
        run.metrics.errors.labels(str(e.status)).inc()
        yield dumps(e.body())
    yield "[DONE]"
