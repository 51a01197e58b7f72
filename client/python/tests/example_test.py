"""examples/generate.py end to end against the in-process fake server."""

import contextlib
import importlib.util
import io
import os
import unittest

import grpc

from fake_generation_server import FakeServer, chunk, complete
from hybridserve_client import encode_bytes
from hybridserve_client.proto import generation_pb2 as pb


def _load_example():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "generate.py")
    spec = importlib.util.spec_from_file_location("generate_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ExampleTest(unittest.TestCase):

    def setUp(self):
        self.server = FakeServer()
        self.example = _load_example()

    def tearDown(self):
        self.server.stop()

    def run_example(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = self.example.main(["--target", self.server.target, "--timeout", "10"] + list(args))
        return code, out.getvalue(), err.getvalue()

    def test_streams_text_including_a_character_split_across_chunks(self):
        text = encode_bytes(" wörld")  # ö is two bytes: split them across chunks
        self.server.servicer.generate_script = lambda request, context: iter([
            chunk(text[:3]), chunk(text[3:] + [258]),
            complete(pb.FINISH_REASON_STOP, stop_token_id=258, prompt_tokens=6,
                     completion_tokens=8, resume_kind=pb.RESUME_KIND_COLD)])

        code, out, err = self.run_example("--prompt", "Hello", "--temperature", "0", "--seed", "3")

        self.assertEqual(code, 0, err)
        self.assertEqual(out, " wörld\n")
        self.assertIn("finish_reason=stop stop_token_id=258", err)
        self.assertIn("usage: prompt=6 completion=8 cached=0 recomputed=0 resume=cold", err)
        request, = self.server.servicer.requests
        self.assertEqual(list(request.prompt_token_ids), [257] + encode_bytes("Hello"))
        self.assertEqual(request.sampling.temperature, 0.0)
        self.assertTrue(request.sampling.HasField("temperature"))
        self.assertFalse(request.sampling.HasField("top_p"))
        self.assertEqual(request.sampling.seed, 3)

    def test_an_rpc_error_is_reported_with_its_code_and_exit_status_1(self):
        def script(request, context):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens must be > 0")
            yield
        self.server.servicer.generate_script = script

        code, out, err = self.run_example("--max-tokens", "0")

        self.assertEqual(code, 1)
        self.assertIn("INVALID_ARGUMENT: max_tokens must be > 0", err)

    def test_model_info_prints_the_info(self):
        self.server.servicer.model_info_script = lambda request, context: pb.ModelInfo(
            model_name="default", vocab_size=259)

        code, out, err = self.run_example("--model-info")

        self.assertEqual(code, 0, err)
        self.assertIn("model_name='default'", out)
        self.assertIn("vocab_size=259", out)


if __name__ == "__main__":
    unittest.main()
