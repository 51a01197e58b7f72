"""Client against an in-process fake Generation server on a loopback port.

Every wait is bounded (WAIT_S); synchronization is by events, never sleeps.
"""

import re
import threading
import unittest

import grpc

from fake_generation_server import FakeServer, chunk, complete
from hybridserve_client import (Client, FinishReason, HybridserveError, ModelInfo, ResumeKind,
                                StreamProtocolError, TokenChunk, TopLogprob, GenerateResult)
from hybridserve_client.proto import generation_pb2 as pb

WAIT_S = 10.0  # generous bound on any wait; a passing test never reaches it


class ClientTest(unittest.TestCase):

    def setUp(self):
        self.server = FakeServer()
        self.fake = self.server.servicer
        self.client = Client(self.server.target, timeout=WAIT_S)

    def tearDown(self):
        self.client.close()
        self.server.stop()

    def test_generate_collects_chunks_logprobs_and_usage(self):
        def script(request, context):
            yield chunk([72, 105], logprobs=[-0.5, -1.0], top_logprobs=[[(72, -0.5)], [(105, -1.0)]])
            yield chunk([33], logprobs=[-0.25], top_logprobs=[[(33, -0.25)]])
            yield complete(pb.FINISH_REASON_STOP, stop_token_id=258, prompt_tokens=5,
                           completion_tokens=3, cached_tokens=2, recomputed_tokens=1,
                           resume_kind=pb.RESUME_KIND_GRID_CHECKPOINT)
        self.fake.generate_script = script

        result = self.client.generate([1, 2, 3, 4, 5], 8, return_logprobs=True, top_logprobs=1,
                                      request_id="r1")

        self.assertEqual(result.request_id, "r1")
        self.assertEqual(result.token_ids, (72, 105, 33))
        self.assertEqual(result.logprobs, (-0.5, -1.0, -0.25))
        self.assertEqual(result.top_logprobs, ((TopLogprob(72, -0.5),), (TopLogprob(105, -1.0),),
                                               (TopLogprob(33, -0.25),)))
        self.assertEqual(result.finish_reason, FinishReason.STOP)
        self.assertEqual(result.finish_reason, "stop")
        self.assertEqual(result.stop_token_id, 258)
        self.assertEqual(result.usage.prompt_tokens, 5)
        self.assertEqual(result.usage.completion_tokens, 3)
        self.assertEqual(result.usage.cached_tokens, 2)
        self.assertEqual(result.usage.recomputed_tokens, 1)
        self.assertEqual(result.usage.resume_kind, ResumeKind.GRID_CHECKPOINT)
        self.assertEqual(result.error_message, "")
        self.assertIsNotNone(result.ttft_seconds)
        self.assertLessEqual(result.ttft_seconds, result.total_seconds)

    def test_logprobs_are_none_when_not_requested_and_stop_token_id_only_for_stop(self):
        self.fake.generate_script = lambda request, context: iter([
            chunk([1, 2]), complete(pb.FINISH_REASON_LENGTH, stop_token_id=7)])

        result = self.client.generate([0], 2)

        self.assertEqual(result.token_ids, (1, 2))
        self.assertIsNone(result.logprobs)
        self.assertIsNone(result.top_logprobs)
        self.assertEqual(result.finish_reason, FinishReason.LENGTH)
        self.assertIsNone(result.stop_token_id)

    def test_stream_yields_each_chunk_before_the_server_sends_the_next(self):
        first_received = threading.Event()

        def script(request, context):
            yield chunk([10])
            # Only a client that hands out the first chunk before the stream
            # ends can let the server go on.
            if not first_received.wait(WAIT_S):
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "client did not stream")
            yield chunk([11])
            yield complete(pb.FINISH_REASON_LENGTH, completion_tokens=2)
        self.fake.generate_script = script

        with self.client.stream([0], 2) as events:
            first = next(events)
            self.assertEqual(first, TokenChunk(token_ids=(10,)))
            first_received.set()
            rest = list(events)

        self.assertEqual(rest[0], TokenChunk(token_ids=(11,)))
        self.assertIsInstance(rest[1], GenerateResult)
        self.assertEqual(len(rest), 2)
        self.assertIs(events.result, rest[1])
        self.assertEqual(events.result.token_ids, (10, 11))

    def _script_held_open_until_terminated(self, terminated):
        """A Generate that sends one chunk, then holds its RPC open for 3 * WAIT_S
        (past the client's deadline too): an RPC that ends within WAIT_S was
        cancelled by the client. `terminated` is set when the RPC ends, by
        gRPC's termination callback: a cancelled handler is never resumed
        after its yield, so the handler itself cannot report it."""
        def script(request, context):
            context.add_callback(terminated.set)
            yield chunk([1])
            terminated.wait(3 * WAIT_S)
        return script

    def test_closing_the_stream_cancels_the_rpc_on_the_server(self):
        terminated = threading.Event()
        self.fake.generate_script = self._script_held_open_until_terminated(terminated)

        events = self.client.stream([0], 100, timeout=3 * WAIT_S)
        self.assertEqual(next(events).token_ids, (1,))
        self.assertFalse(terminated.is_set())
        events.close()

        self.assertTrue(terminated.wait(WAIT_S))
        self.assertRaises(StopIteration, next, events)

    def test_dropping_the_stream_cancels_the_rpc_on_the_server(self):
        terminated = threading.Event()
        self.fake.generate_script = self._script_held_open_until_terminated(terminated)

        events = self.client.stream([0], 100, timeout=3 * WAIT_S)
        next(events)
        del events  # the last reference: CPython closes the generator at once

        self.assertTrue(terminated.wait(WAIT_S))

    def test_cancel_ends_the_rpc_and_raises_cancelled_to_the_reader(self):
        terminated = threading.Event()
        self.fake.generate_script = self._script_held_open_until_terminated(terminated)

        events = self.client.stream([0], 100, timeout=3 * WAIT_S)
        next(events)
        canceller = threading.Thread(target=events.cancel)
        canceller.start()
        canceller.join(WAIT_S)

        with self.assertRaises(HybridserveError) as raised:
            next(events)
        self.assertEqual(raised.exception.code, grpc.StatusCode.CANCELLED)
        self.assertEqual(raised.exception.request_id, events.request_id)
        self.assertTrue(terminated.wait(WAIT_S))

    def test_error_status_raises_with_code_and_message(self):
        for code, message in [(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens must be > 0"),
                              (grpc.StatusCode.RESOURCE_EXHAUSTED, "no capacity"),
                              (grpc.StatusCode.UNAVAILABLE, "draining")]:
            with self.subTest(code=code):
                def script(request, context, code=code, message=message):
                    context.abort(code, message)
                    yield  # a generator, as a streaming handler is
                self.fake.generate_script = script

                with self.assertRaises(HybridserveError) as raised:
                    self.client.generate([0], 1, request_id="bad")
                self.assertEqual(raised.exception.code, code)
                self.assertEqual(raised.exception.message, message)
                self.assertEqual(raised.exception.request_id, "bad")
                self.assertIn(code.name, str(raised.exception))
                self.assertIn(message, str(raised.exception))

    def test_error_after_tokens_streamed_raises_after_the_tokens(self):
        def script(request, context):
            yield chunk([5])
            context.abort(grpc.StatusCode.INTERNAL, "worker lost")
        self.fake.generate_script = script

        events = self.client.stream([0], 4)
        self.assertEqual(next(events).token_ids, (5,))
        with self.assertRaises(HybridserveError) as raised:
            next(events)
        self.assertEqual(raised.exception.code, grpc.StatusCode.INTERNAL)
        self.assertEqual(raised.exception.message, "worker lost")

    def test_deadline_raises_deadline_exceeded(self):
        def script(request, context):
            ended = threading.Event()
            context.add_callback(ended.set)
            ended.wait(WAIT_S)  # until the client's deadline ends the RPC
            yield complete()
        self.fake.generate_script = script

        with self.assertRaises(HybridserveError) as raised:
            self.client.generate([0], 1, timeout=0.2)
        self.assertEqual(raised.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)

    def test_stream_ending_without_complete_is_an_error(self):
        self.fake.generate_script = lambda request, context: iter([chunk([1, 2])])

        with self.assertRaises(StreamProtocolError) as raised:
            self.client.generate([0], 4)
        self.assertIsInstance(raised.exception, HybridserveError)
        self.assertEqual(raised.exception.code, grpc.StatusCode.INTERNAL)
        self.assertIn("without its `complete`", raised.exception.message)

    def test_malformed_streams_are_errors(self):
        cases = {
            "after `complete`": [complete(), chunk([1])],
            "neither": [pb.GenerateResponse()],
            "logprobs": [chunk([1, 2], logprobs=[-1.0]), complete()],
        }
        for what, responses in cases.items():
            with self.subTest(what=what):
                self.fake.generate_script = lambda request, context, r=responses: iter(r)
                with self.assertRaises(StreamProtocolError) as raised:
                    self.client.generate([0], 4, return_logprobs=True)
                self.assertIn(what, raised.exception.message)

    def test_generation_error_is_a_result_with_the_tokens_before_it(self):
        self.fake.generate_script = lambda request, context: iter([
            chunk([7]), complete(pb.FINISH_REASON_ERROR, error_message="kernel failed")])

        result = self.client.generate([0], 4)

        self.assertEqual(result.finish_reason, FinishReason.ERROR)
        self.assertEqual(result.error_message, "kernel failed")
        self.assertEqual(result.token_ids, (7,))

    def test_unknown_enum_values_map_to_unspecified(self):
        self.fake.generate_script = lambda request, context: iter([pb.GenerateResponse(
            complete=pb.GenerateComplete(finish_reason=99, usage=pb.Usage(resume_kind=42)))])

        result = self.client.generate([0], 1)

        self.assertEqual(result.finish_reason, FinishReason.UNSPECIFIED)
        self.assertEqual(result.usage.resume_kind, ResumeKind.UNSPECIFIED)
        self.assertIsNone(result.ttft_seconds)

    def test_optional_sampling_fields_are_absent_when_none_and_present_when_zero(self):
        self.fake.generate_script = lambda request, context: iter([complete()])

        self.client.generate([3, 4], 16)
        self.client.generate([3, 4], 16, temperature=0.0, top_p=0.0, top_k=0, seed=0)
        self.client.generate([3, 4], 16, temperature=0.7, top_p=0.9, top_k=40, seed=2**64 - 1)

        unset, zero, values = self.fake.requests
        for field in ("temperature", "top_p", "top_k", "seed"):
            self.assertFalse(unset.sampling.HasField(field), field)
            self.assertTrue(zero.sampling.HasField(field), field)
            self.assertEqual(getattr(zero.sampling, field), 0, field)
        self.assertAlmostEqual(values.sampling.temperature, 0.7, places=6)  # float32 on the wire
        self.assertAlmostEqual(values.sampling.top_p, 0.9, places=6)
        self.assertEqual(values.sampling.top_k, 40)
        self.assertEqual(values.sampling.seed, 2**64 - 1)

    def test_request_fields_map_to_the_proto(self):
        self.fake.generate_script = lambda request, context: iter([complete()])

        self.client.generate([1, 2, 3], 32, stop_token_ids=[258, 10],
                             stop_sequences=[[46, 46], (33,)], ignore_eos=True,
                             cache_salt="tenant-a", return_logprobs=True, top_logprobs=5,
                             request_id="req-7")

        request, = self.fake.requests
        self.assertEqual(request.request_id, "req-7")
        self.assertEqual(list(request.prompt_token_ids), [1, 2, 3])
        self.assertEqual(request.stop.max_tokens, 32)
        self.assertEqual(list(request.stop.stop_token_ids), [258, 10])
        self.assertEqual([list(s.token_ids) for s in request.stop.stop_sequences], [[46, 46], [33]])
        self.assertTrue(request.stop.ignore_eos)
        self.assertEqual(request.cache_salt, "tenant-a")
        self.assertTrue(request.return_logprobs)
        self.assertEqual(request.top_logprobs, 5)

    def test_request_id_defaults_to_a_fresh_uuid4_hex(self):
        self.fake.generate_script = lambda request, context: iter([complete()])

        first = self.client.generate([0], 1).request_id
        second = self.client.stream([0], 1)
        list(second)

        self.assertRegex(first, re.compile(r"^[0-9a-f]{32}$"))
        self.assertNotEqual(first, second.request_id)
        self.assertEqual([r.request_id for r in self.fake.requests], [first, second.request_id])

    def test_abort_round_trip(self):
        self.fake.abort_script = lambda request, context: pb.AbortResponse(
            aborted_request_ids=[i for i in request.request_ids if i != "unknown"])

        self.assertEqual(self.client.abort(["a", "unknown", "b"]), ["a", "b"])
        self.assertEqual(self.client.abort("a"), ["a"])
        self.assertEqual([list(r.request_ids) for r in self.fake.requests],
                         [["a", "unknown", "b"], ["a"]])

    def test_abort_error_raises_with_code_and_message(self):
        def script(request, context):
            context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
        self.fake.abort_script = script

        with self.assertRaises(HybridserveError) as raised:
            self.client.abort(["a"])
        self.assertEqual((raised.exception.code, raised.exception.message),
                         (grpc.StatusCode.UNAVAILABLE, "draining"))

    def test_model_info_round_trip(self):
        self.fake.model_info_script = lambda request, context: pb.ModelInfo(
            model_name="default", vocab_size=259, max_context_tokens=4096, eos_token_ids=[258],
            chunk_size=64, page_size=16, checkpoint_interval=256, fingerprint="ab12")

        self.assertEqual(self.client.model_info(), ModelInfo(
            model_name="default", vocab_size=259, max_context_tokens=4096, eos_token_ids=(258,),
            chunk_size=64, page_size=16, checkpoint_interval=256, fingerprint="ab12"))

    def test_model_info_error_raises_with_code_and_message(self):
        def script(request, context):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no model")
        self.fake.model_info_script = script

        with self.assertRaises(HybridserveError) as raised:
            self.client.model_info()
        self.assertEqual((raised.exception.code, raised.exception.message),
                         (grpc.StatusCode.UNIMPLEMENTED, "no model"))


if __name__ == "__main__":
    unittest.main()
