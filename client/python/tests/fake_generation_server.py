"""An in-process Generation server on a loopback port, scripted per test.

Thread-safe: handlers run on the server's thread pool; what they record is
read by the test after an event or the call's return.
"""

from concurrent import futures

import grpc

from hybridserve_client.proto import generation_pb2 as pb
from hybridserve_client.proto import generation_pb2_grpc as pb_grpc


class FakeGeneration(pb_grpc.GenerationServicer):
    """Each RPC runs the matching script: a callable set by the test.

    generate_script(request, context) -> iterable of GenerateResponse
    abort_script(request, context) -> AbortResponse
    model_info_script(request, context) -> ModelInfo
    Every request received is appended to `requests`.
    """

    def __init__(self):
        self.requests = []
        self.generate_script = None
        self.abort_script = None
        self.model_info_script = None

    def Generate(self, request, context):
        self.requests.append(request)
        yield from self.generate_script(request, context)

    def Abort(self, request, context):
        self.requests.append(request)
        return self.abort_script(request, context)

    def GetModelInfo(self, request, context):
        self.requests.append(request)
        return self.model_info_script(request, context)


class FakeServer:
    """Starts a FakeGeneration on 127.0.0.1:<free port>; stop() with a grace."""

    def __init__(self):
        self.servicer = FakeGeneration()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_GenerationServicer_to_server(self.servicer, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.target = "127.0.0.1:%d" % port
        self._server.start()

    def stop(self):
        self._server.stop(grace=None).wait(timeout=10)


def chunk(token_ids, logprobs=(), top_logprobs=()):
    """A GenerateResponse chunk; top_logprobs is a list of [(id, logprob), ...] per token."""
    message = pb.TokenChunk(token_ids=list(token_ids), logprobs=list(logprobs))
    for alternatives in top_logprobs:
        entry = message.top_logprobs.add()
        for token_id, logprob in alternatives:
            entry.entries.add(token_id=token_id, logprob=logprob)
    return pb.GenerateResponse(chunk=message)


def complete(finish_reason=pb.FINISH_REASON_LENGTH, stop_token_id=0, error_message="", **usage):
    return pb.GenerateResponse(complete=pb.GenerateComplete(
        finish_reason=finish_reason,
        usage=pb.Usage(**usage),
        stop_token_id=stop_token_id,
        error_message=error_message,
    ))

