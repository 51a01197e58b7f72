"""Text in and out (generate(text=...), stream(text=...), chat()) with the
default model's byte vocabulary, against the in-process fake server; the
end-of-turn tokens in model_info. tokenizers_test.py covers tokenizer.json.
"""

import unittest

from fake_generation_server import FakeServer, chunk, complete
from hybridserve_client import ByteTokenizer, Client, ModelInfo, SpecialToken, TokenChunk, encode_bytes
from hybridserve_client.proto import generation_pb2 as pb

WAIT_S = 10.0  # bound on any call; a passing test never reaches it


def model_info(vocab_size=259, end_of_turn=((258, "<eos>"),)):
    return pb.ModelInfo(model_name="default", vocab_size=vocab_size, eos_token_ids=[258],
                        end_of_turn_tokens=[pb.SpecialToken(id=i, text=t) for i, t in end_of_turn])


class TextTest(unittest.TestCase):

    def setUp(self):
        self.server = FakeServer()
        self.fake = self.server.servicer
        self.fake.model_info_script = lambda request, context: model_info()
        self.client = Client(self.server.target, timeout=WAIT_S)

    def tearDown(self):
        self.client.close()
        self.server.stop()

    def generate_requests(self):
        return [r for r in self.fake.requests if isinstance(r, pb.GenerateRequest)]

    def test_text_prompt_is_bos_and_bytes_and_the_reply_is_decoded_per_chunk_and_whole(self):
        reply = "é!".encode("utf-8")  # 0xC3 0xA9 0x21: "é" split across two chunks
        def script(request, context):
            yield chunk([reply[0]])
            yield chunk([reply[1], reply[2]])
            yield complete(pb.FINISH_REASON_STOP, stop_token_id=258)
        self.fake.generate_script = script

        with self.client.stream(text="Héllo", max_tokens=8) as events:
            items = list(events)
        self.assertEqual([i.text for i in items if isinstance(i, TokenChunk)], ["", "é!"])
        self.assertEqual(events.result.text, "é!")
        self.assertEqual(list(self.generate_requests()[0].prompt_token_ids), encode_bytes("Héllo", add_bos=True))

        result = self.client.generate(text="Héllo", max_tokens=8)
        self.assertEqual(result.text, "é!")
        # Asked once, for the vocabulary check.
        self.assertEqual(sum(isinstance(r, pb.GetModelInfoRequest) for r in self.fake.requests), 1)

    def test_token_id_calls_have_no_text(self):
        self.fake.generate_script = lambda request, context: iter([chunk([72]), complete()])
        with self.client.stream([257, 72], 4) as events:
            items = list(events)
        self.assertIsNone(items[0].text)
        self.assertIsNone(events.result.text)
        self.assertFalse(any(isinstance(r, pb.GetModelInfoRequest) for r in self.fake.requests))

    def test_text_without_a_tokenizer_on_another_vocabulary_is_refused_before_generating(self):
        self.fake.model_info_script = lambda request, context: model_info(vocab_size=32000)
        with self.assertRaisesRegex(ValueError, "vocab_size 32000.*tokenizer_dir"):
            self.client.generate(text="Hi", max_tokens=4)
        self.assertEqual(self.generate_requests(), [])

    def test_prompt_arguments_are_checked(self):
        with self.assertRaisesRegex(ValueError, "not both"):
            self.client.stream([1], 4, text="x")
        with self.assertRaisesRegex(ValueError, "give prompt_token_ids or text"):
            self.client.stream(max_tokens=4)
        with self.assertRaisesRegex(ValueError, "max_tokens is required"):
            self.client.stream([1])
        with self.assertRaisesRegex(ValueError, "not both"):
            Client(self.server.target, tokenizer=ByteTokenizer(), tokenizer_dir="/nonexistent")

    def test_chat_frames_turns_and_stops_at_the_end_of_turn_tokens(self):
        self.fake.model_info_script = lambda request, context: model_info(end_of_turn=((258, "<eos>"), (10, "\n")))
        def script(request, context):
            yield chunk(encode_bytes(" Fine.") + [258])
            yield complete(pb.FINISH_REASON_STOP, stop_token_id=258)
        self.fake.generate_script = script

        messages = [{"role": "user", "content": "How are you?"}]
        first = self.client.chat(messages, max_tokens=16, stop_token_ids=[7], temperature=0.0)
        self.assertEqual(first.text, " Fine.")
        messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Sure?"}]
        self.client.chat(messages, max_tokens=16)

        first_request, second_request = self.generate_requests()
        self.assertEqual(list(first_request.prompt_token_ids), encode_bytes("Q: How are you?\nA:", add_bos=True))
        self.assertEqual(list(first_request.stop.stop_token_ids), [7, 258, 10])
        self.assertEqual(first_request.sampling.temperature, 0.0)
        self.assertEqual(list(second_request.prompt_token_ids),
                         encode_bytes("Q: How are you?\nA: Fine.", add_bos=True) + [258, 257]
                         + encode_bytes("Q: Sure?\nA:"))
        self.assertEqual(list(second_request.stop.stop_token_ids), [258, 10])
        self.assertEqual(sum(isinstance(r, pb.GetModelInfoRequest) for r in self.fake.requests), 1)

    def test_model_info_carries_the_end_of_turn_tokens(self):
        self.assertEqual(self.client.model_info(), ModelInfo(
            model_name="default", vocab_size=259, max_context_tokens=0, eos_token_ids=(258,), chunk_size=0,
            page_size=0, checkpoint_interval=0, fingerprint="",
            end_of_turn_tokens=(SpecialToken(258, "<eos>"),)))


if __name__ == "__main__":
    unittest.main()
