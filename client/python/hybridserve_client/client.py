"""Client for the Generation service (proto/generation.proto) on grpcio.

Thread-safety: a Client is thread-safe (one gRPC channel, shared). A
GenerateStream is consumed by one thread; its cancel() may be called from any.
"""

import dataclasses
import threading
import time
import uuid

import grpc

from . import byte_vocab
from .errors import StreamProtocolError, from_rpc_error
from .proto import generation_pb2 as pb
from .proto import generation_pb2_grpc as pb_grpc
from .results import (FinishReason, GenerateResult, ModelInfo, ResumeKind, SessionOutcome,
                      SpecialToken, TokenChunk, TopLogprob, Usage)
from .tokenizer import ByteTokenizer, load_tokenizer

_FINISH_REASONS = {
    pb.FINISH_REASON_STOP: FinishReason.STOP,
    pb.FINISH_REASON_LENGTH: FinishReason.LENGTH,
    pb.FINISH_REASON_ABORT: FinishReason.ABORT,
    pb.FINISH_REASON_ERROR: FinishReason.ERROR,
}
_RESUME_KINDS = {
    pb.RESUME_KIND_COLD: ResumeKind.COLD,
    pb.RESUME_KIND_GRID_CHECKPOINT: ResumeKind.GRID_CHECKPOINT,
    pb.RESUME_KIND_EXACT_PREFIX: ResumeKind.EXACT_PREFIX,
}


class Client:
    """Talks to one decode worker (or a load balancer in front of several).

        with Client("localhost:50050", timeout=60) as client:
            result = client.generate(encode_bytes("Hello"), max_tokens=32)
            print(decode_bytes(result.token_ids), result.finish_reason, result.usage)

        with Client.from_model_dir("localhost:50050", "path/to/model") as client:
            print(client.generate(text="Hello", max_tokens=32).text)
            print(client.chat([{"role": "user", "content": "Hi!"}], max_tokens=64).text)

    Every call raises HybridserveError (code + message) when its RPC fails.
    """

    def __init__(self, target, timeout=None, *, tokenizer=None, tokenizer_dir=None, credentials=None,
                 options=(), tls_ca=None, tls_cert=None, tls_key=None, tls_server_name=None,
                 tenant_header=None):
        """
        Args:
          target: "host:port" (any gRPC target string).
          timeout: default deadline of every call, in seconds; None for none.
            A call's own `timeout` argument replaces it.
          tokenizer: what text= and chat() encode and decode with: an
            HfTokenizer or ByteTokenizer (hybridserve_client.tokenizer).
          tokenizer_dir: a model directory to load it from instead
            (load_tokenizer: tokenizer.json, else the byte vocabulary that
            config.json declares). With neither, text= and chat() use the
            default model's byte vocabulary, after checking that the served
            model's vocab_size is its (ValueError otherwise).
          credentials: grpc.ChannelCredentials for TLS; None for plaintext
            (or the tls_* files below).
          options: gRPC channel options, e.g. (("grpc.max_receive_message_length", n),).
          tls_ca: path of the CA bundle (PEM) that verifies the decode worker's
            certificate; turns TLS on.
          tls_cert, tls_key: paths of a client certificate chain and its key
            (PEM) for mutual TLS: the tenant, where the worker takes tenants
            from certificates.
          tls_server_name: the name the worker's certificate must hold instead
            of the target's host.
          tenant_header: sent as x-hybridserve-tenant on every call: a front
            proxy's assertion of its user's tenant, which the worker accepts
            only on a connection whose certificate it trusts as a proxy's
            (PERMISSION_DENIED otherwise).
        """
        options = list(options)
        if tls_ca is not None:
            if credentials is not None:
                raise ValueError("give credentials or tls_* files, not both")
            if (tls_cert is None) != (tls_key is None):
                raise ValueError("tls_cert and tls_key go together")

            def read(path):
                with open(path, "rb") as f:
                    return f.read()

            credentials = grpc.ssl_channel_credentials(
                root_certificates=read(tls_ca),
                private_key=read(tls_key) if tls_key else None,
                certificate_chain=read(tls_cert) if tls_cert else None)
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
        elif tls_cert is not None or tls_key is not None or tls_server_name is not None:
            raise ValueError("tls_cert, tls_key and tls_server_name need tls_ca")
        self._metadata = (("x-hybridserve-tenant", tenant_header),) if tenant_header else ()
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=options)
        self._stub = pb_grpc.GenerationStub(self._channel)
        self._timeout = timeout
        if tokenizer is not None and tokenizer_dir is not None:
            raise ValueError("give tokenizer or tokenizer_dir, not both")
        self._tokenizer = load_tokenizer(tokenizer_dir) if tokenizer_dir is not None else tokenizer
        self._lock = threading.Lock()
        self._model_info = None  # the first model_info() answer, for chat()

    @classmethod
    def from_model_dir(cls, target, model_dir, timeout=None, **kwargs):
        """A Client whose text= and chat() use model_dir's tokenizer (the
        directory the server was started with, or a copy of its tokenizer
        files). kwargs are __init__'s."""
        return cls(target, timeout, tokenizer_dir=model_dir, **kwargs)

    def close(self):
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def generate(self, prompt_token_ids=None, max_tokens=None, *, text=None, temperature=None,
                 top_p=None, top_k=None, seed=None, stop_token_ids=(), stop_sequences=(),
                 ignore_eos=False, cache_salt="", return_logprobs=False, top_logprobs=0,
                 request_id=None, timeout=None, session_keep=None, session_pin=False):
        """Runs one generation to its end and returns a GenerateResult.

        The arguments are stream()'s. A generation that fails after it
        started is a result with finish_reason ERROR, not an exception.
        With text=, the result's .text is the reply.

        Raises:
          HybridserveError: the RPC failed (e.g. INVALID_ARGUMENT,
            RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED);
            StreamProtocolError when the server broke the stream contract.
        """
        with self.stream(prompt_token_ids, max_tokens, text=text, temperature=temperature, top_p=top_p,
                         top_k=top_k, seed=seed, stop_token_ids=stop_token_ids,
                         stop_sequences=stop_sequences, ignore_eos=ignore_eos,
                         cache_salt=cache_salt, return_logprobs=return_logprobs,
                         top_logprobs=top_logprobs, request_id=request_id,
                         timeout=timeout, session_keep=session_keep,
                         session_pin=session_pin) as events:
            for _ in events:
                pass
        return events.result

    def stream(self, prompt_token_ids=None, max_tokens=None, *, text=None, temperature=None,
               top_p=None, top_k=None, seed=None, stop_token_ids=(), stop_sequences=(),
               ignore_eos=False, cache_salt="", return_logprobs=False, top_logprobs=0,
               request_id=None, timeout=None, session_keep=None, session_pin=False):
        """Starts a generation; returns a GenerateStream yielding TokenChunk
        items as the server sends them, then the GenerateResult as its last.

        The RPC starts at the first next(). Closing the stream (close(), the
        with-block's end, or dropping it) cancels the RPC; the server then ends
        the generation as aborted.

        Args:
          prompt_token_ids: ints; the prompt. Give it or text, not both.
          max_tokens: upper bound on generated tokens, > 0 (required).
          text: the prompt as text, encoded by the Client's tokenizer as a
            prompt (with the <bos> it adds); then every TokenChunk's .text and
            the result's .text hold the decoded reply.
          temperature, top_p, top_k, seed: sampling; None leaves the field
            absent so the server applies its documented default (temperature
            1.0, top_p 1.0, top_k 0 = disabled, seed derived from request_id).
            0 is sent as 0: temperature=0.0 means greedy.
          stop_token_ids: ids that end generation (besides EOS unless ignore_eos).
          stop_sequences: sequences of ids; generation ends when the output ends
            with one of them.
          ignore_eos: do not stop at the model's EOS ids.
          cache_salt: tenant isolation; requests with different salts share no
            cache entries.
          return_logprobs: return each sampled token's log-probability.
          top_logprobs: also return this many most likely alternatives per token (0..20).
          request_id: unique among this client's requests in flight, used by
            abort(); default a fresh uuid4 hex. Also on the stream as .request_id.
          timeout: deadline of the whole stream, in seconds; default the Client's.
          session_keep: seconds the cache keeps this turn's end state (the
            conversation's resume point) after its last use, capped by the
            cachestore's maximum; None: the cache's default TTL.
          session_pin: never evict that state to make room, only its keep time
            ends it; granted within the tenant's pin quota (a refusal is in
            result.usage.session, not an error).

        Raises (while iterating): HybridserveError, as generate().
        Raises (at once): ValueError for missing or conflicting arguments.
        """
        tokenizer = None
        if text is not None:
            if prompt_token_ids is not None:
                raise ValueError("give prompt_token_ids or text, not both")
            tokenizer = self.tokenizer()
            prompt_token_ids = tokenizer.encode(text)
        elif prompt_token_ids is None:
            raise ValueError("give prompt_token_ids or text")
        return self._stream(prompt_token_ids, max_tokens, tokenizer, temperature=temperature, top_p=top_p,
                            top_k=top_k, seed=seed, stop_token_ids=stop_token_ids,
                            stop_sequences=stop_sequences, ignore_eos=ignore_eos, cache_salt=cache_salt,
                            return_logprobs=return_logprobs, top_logprobs=top_logprobs,
                            request_id=request_id, timeout=timeout, session_keep=session_keep,
                            session_pin=session_pin)

    def chat(self, messages, max_tokens, *, stop_token_ids=(), tools=None, documents=None,
             chat_template_kwargs=None, **kwargs):
        """Generates the assistant's reply to a conversation; returns a
        GenerateResult whose .text is the reply.

        messages: [{"role": "user" | "assistant" | "system", "content": str}, ...],
          rendered by the tokenizer's chat template (HfTokenizer: the
          checkpoint's, as transformers' apply_chat_template renders it with
          add_generation_prompt; ByteTokenizer: "Q: ...\nA:" turns). The
          whole conversation is sent each turn: the server resumes it from the
          state the previous turn left in its cache.
        tools, documents: passed to the template as transformers passes them
          (tools: JSON schemas). chat_template_kwargs: more template
          variables, e.g. {"enable_thinking": False}.
        Generation stops at stop_token_ids, at the model's end-of-turn tokens
        (model_info(), asked once per Client: generation_config.json's
        eos_token_id and tokenizer_config.json's eos_token) and at the token
        the chat template itself ends an assistant turn with
        (tokenizer.end_of_turn_ids()). Other kwargs are stream()'s.

        Raises: as generate(); ValueError when the tokenizer has no chat
        template; jinja2.TemplateError when the template refuses the
        conversation.
        """
        tokenizer = self.tokenizer()
        template_kwargs = dict(chat_template_kwargs or {})
        if tools is not None:
            template_kwargs["tools"] = tools
        if documents is not None:
            template_kwargs["documents"] = documents
        prompt = tokenizer.apply_chat_template(messages, **template_kwargs)
        stops = list(stop_token_ids)
        for token_id in [t.id for t in self._cached_model_info(kwargs.get("timeout")).end_of_turn_tokens] + \
                list(tokenizer.end_of_turn_ids()):
            if token_id not in stops:
                stops.append(token_id)
        with self._stream(prompt, max_tokens, tokenizer, stop_token_ids=stops, **kwargs) as events:
            for _ in events:
                pass
        return events.result

    def tokenizer(self):
        """The tokenizer text= and chat() use (see __init__); the byte
        vocabulary's after checking the served model's vocab_size when none was given.

        Raises: ValueError (no tokenizer given, and the model is not byte-level);
          HybridserveError from model_info().
        """
        if self._tokenizer is not None:
            return self._tokenizer
        info = self._cached_model_info(None)
        if info.vocab_size != byte_vocab.VOCAB_SIZE:
            raise ValueError(
                "model %r has vocab_size %d, not the byte vocabulary's %d: give the Client a tokenizer "
                "(tokenizer_dir= or Client.from_model_dir)" % (info.model_name, info.vocab_size,
                                                                byte_vocab.VOCAB_SIZE))
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = ByteTokenizer()
            return self._tokenizer

    def _cached_model_info(self, timeout):
        with self._lock:
            info = self._model_info
        if info is None:
            info = self.model_info(timeout)
            with self._lock:
                self._model_info = info
        return info

    def _stream(self, prompt_token_ids, max_tokens, tokenizer, *, temperature=None, top_p=None, top_k=None,
                seed=None, stop_token_ids=(), stop_sequences=(), ignore_eos=False, cache_salt="",
                return_logprobs=False, top_logprobs=0, request_id=None, timeout=None, session_keep=None,
                session_pin=False):
        if max_tokens is None:
            raise ValueError("max_tokens is required")
        request = pb.GenerateRequest(
            request_id=request_id if request_id is not None else uuid.uuid4().hex,
            prompt_token_ids=list(prompt_token_ids),
            cache_salt=cache_salt,
            return_logprobs=return_logprobs,
            top_logprobs=top_logprobs,
        )
        if temperature is not None:
            request.sampling.temperature = temperature
        if top_p is not None:
            request.sampling.top_p = top_p
        if top_k is not None:
            request.sampling.top_k = top_k
        if seed is not None:
            request.sampling.seed = seed
        if session_keep is not None:
            if session_keep < 0:
                raise ValueError("session_keep must not be negative")
            request.session.keep.FromNanoseconds(int(round(session_keep * 1e9)))
        if session_pin:
            request.session.pin = True
        request.stop.max_tokens = max_tokens
        request.stop.stop_token_ids.extend(stop_token_ids)
        for sequence in stop_sequences:
            request.stop.stop_sequences.add(token_ids=list(sequence))
        request.stop.ignore_eos = ignore_eos
        return GenerateStream(self._stub, request, self._deadline(timeout), self._metadata, tokenizer)

    def abort(self, request_ids, timeout=None):
        """Aborts generations by request id (a str or an iterable of them).

        Returns the ids that were in flight and are now aborting; unknown ids
        are ignored by the server. Each aborted stream still ends with its
        result, finish_reason ABORT.
        """
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        try:
            response = self._stub.Abort(pb.AbortRequest(request_ids=list(request_ids)),
                                        timeout=self._deadline(timeout), metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return list(response.aborted_request_ids)

    def model_info(self, timeout=None):
        """The served model's ModelInfo (name, vocab size, context, EOS and
        end-of-turn tokens, grid)."""
        try:
            info = self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=self._deadline(timeout),
                                           metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return ModelInfo(
            model_name=info.model_name,
            vocab_size=info.vocab_size,
            max_context_tokens=info.max_context_tokens,
            eos_token_ids=tuple(info.eos_token_ids),
            chunk_size=info.chunk_size,
            page_size=info.page_size,
            checkpoint_interval=info.checkpoint_interval,
            fingerprint=info.fingerprint,
            end_of_turn_tokens=tuple(SpecialToken(t.id, t.text) for t in info.end_of_turn_tokens),
        )

    def _deadline(self, timeout):
        return self._timeout if timeout is None else timeout


class GenerateStream:
    """One Generate call as an iterator: TokenChunk items, then the GenerateResult.

        with client.stream(prompt, max_tokens=64) as events:
            for event in events:
                if isinstance(event, TokenChunk):
                    print(decoder.decode(event.token_ids), end="", flush=True)
        print(events.result.finish_reason)

    Attributes:
      request_id: the request's id (for abort()).
      result: the GenerateResult once the stream has ended, else None.

    Consumed by one thread; close() from that thread, cancel() from any.
    """

    def __init__(self, stub, request, timeout, metadata=(), tokenizer=None):
        self.request_id = request.request_id
        self._state = _CallState()
        # The generator holds the state, not self: dropping the stream drops
        # the generator at once (no cycle), whose finally cancels the RPC.
        self._events = _run_generate(stub, request, timeout, metadata, self._state, tokenizer)

    @property
    def result(self):
        return self._state.result

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._events)

    def close(self):
        """Stops iterating; cancels the RPC if it is still running."""
        self._events.close()

    def cancel(self):
        """Cancels the RPC from any thread; the iterating thread then gets
        HybridserveError(CANCELLED) unless the stream had already ended."""
        self._state.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


class _CallState:
    """Shared by a GenerateStream and its generator. Thread-safe."""

    def __init__(self):
        self.result = None
        self._lock = threading.Lock()
        self._call = None
        self._cancelled = False

    def attach(self, call):
        with self._lock:
            self._call = call
            cancelled = self._cancelled
        if cancelled:
            call.cancel()

    def cancel(self):
        with self._lock:
            self._cancelled = True
            call = self._call
        if call is not None:
            call.cancel()


def _run_generate(stub, request, timeout, metadata, state, tokenizer):
    """tokenizer: None, or what fills TokenChunk.text and GenerateResult.text."""
    request_id = request.request_id
    want_logprobs = request.return_logprobs
    want_top = request.top_logprobs > 0
    start = time.monotonic()
    ttft = None
    token_ids, logprobs, top_logprobs = [], [], []
    complete = None
    decoder = tokenizer.stream_decoder() if tokenizer is not None else None

    call = stub.Generate(request, timeout=timeout, metadata=metadata)
    state.attach(call)
    try:
        for response in call:
            kind = response.WhichOneof("response")
            if complete is not None:
                raise StreamProtocolError("a message after `complete`", request_id)
            if kind == "complete":
                complete = response.complete
                total = time.monotonic() - start
            elif kind == "chunk":
                chunk = _to_chunk(response.chunk, want_logprobs, want_top, request_id)
                if decoder is not None:
                    chunk = dataclasses.replace(chunk, text=decoder.decode(chunk.token_ids))
                if ttft is None and chunk.token_ids:
                    ttft = time.monotonic() - start
                token_ids.extend(chunk.token_ids)
                logprobs.extend(chunk.logprobs or ())
                top_logprobs.extend(chunk.top_logprobs or ())
                yield chunk
            else:
                raise StreamProtocolError("a message with neither `chunk` nor `complete`", request_id)
    except grpc.RpcError as e:
        raise from_rpc_error(e, request_id) from None
    finally:
        call.cancel()  # no-op once the RPC has ended

    if complete is None:
        raise StreamProtocolError(
            "stream ended without its `complete` message after %d tokens" % len(token_ids), request_id)
    finish_reason = _FINISH_REASONS.get(complete.finish_reason, FinishReason.UNSPECIFIED)
    state.result = GenerateResult(
        request_id=request_id,
        token_ids=tuple(token_ids),
        logprobs=tuple(logprobs) if want_logprobs else None,
        top_logprobs=tuple(top_logprobs) if want_top else None,
        finish_reason=finish_reason,
        usage=Usage(
            prompt_tokens=complete.usage.prompt_tokens,
            completion_tokens=complete.usage.completion_tokens,
            cached_tokens=complete.usage.cached_tokens,
            recomputed_tokens=complete.usage.recomputed_tokens,
            resume_kind=_RESUME_KINDS.get(complete.usage.resume_kind, ResumeKind.UNSPECIFIED),
            session=SessionOutcome(
                published=complete.usage.session.published,
                keep_seconds=(complete.usage.session.keep.ToNanoseconds() / 1e9
                              if complete.usage.session.HasField("keep") else None),
                pinned=complete.usage.session.pinned,
                pin_refused_reason=complete.usage.session.pin_refused_reason,
            ) if complete.usage.HasField("session") else None,
        ),
        stop_token_id=complete.stop_token_id if finish_reason == FinishReason.STOP else None,
        error_message=complete.error_message,
        ttft_seconds=ttft,
        total_seconds=total,
        text=tokenizer.decode(token_ids) if tokenizer is not None else None,
    )
    yield state.result


def _to_chunk(chunk, want_logprobs, want_top, request_id):
    n = len(chunk.token_ids)
    if want_logprobs and len(chunk.logprobs) != n:
        raise StreamProtocolError("a chunk of %d tokens with %d logprobs" % (n, len(chunk.logprobs)), request_id)
    if want_top and len(chunk.top_logprobs) != n:
        raise StreamProtocolError(
            "a chunk of %d tokens with %d top_logprobs" % (n, len(chunk.top_logprobs)), request_id)
    return TokenChunk(
        token_ids=tuple(chunk.token_ids),
        logprobs=tuple(chunk.logprobs) if want_logprobs else None,
        top_logprobs=tuple(
            tuple(TopLogprob(e.token_id, e.logprob) for e in alternatives.entries)
            for alternatives in chunk.top_logprobs) if want_top else None,
    )
