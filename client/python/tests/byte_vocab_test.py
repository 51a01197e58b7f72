"""The default model's byte vocabulary: ids 0..255 bytes, 256 pad, 257 bos, 258 eos."""

import unittest

from hybridserve_client import (BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteStreamDecoder,
                                decode_bytes, encode_bytes)


class ByteVocabTest(unittest.TestCase):

    def test_special_ids_are_those_of_models_default(self):
        self.assertEqual((PAD_ID, BOS_ID, EOS_ID, VOCAB_SIZE), (256, 257, 258, 259))

    def test_ascii_encodes_to_its_bytes(self):
        self.assertEqual(encode_bytes("Hi!"), [72, 105, 33])
        self.assertEqual(encode_bytes("Hi", add_bos=True), [257, 72, 105])
        self.assertEqual(encode_bytes(b"\x00\xff"), [0, 255])
        self.assertEqual(encode_bytes(""), [])

    def test_non_ascii_encodes_as_utf8_and_round_trips(self):
        self.assertEqual(encode_bytes("é"), [0xC3, 0xA9])
        self.assertEqual(encode_bytes("日"), [0xE6, 0x97, 0xA5])
        for text in ["héllo wörld", "日本語", "emoji \U0001F600", "tab\tnl\n\x00"]:
            with self.subTest(text=text):
                self.assertEqual(decode_bytes(encode_bytes(text)), text)

    def test_decode_skips_pad_bos_and_eos(self):
        self.assertEqual(decode_bytes([257, 72, 256, 105, 258, 256]), "Hi")

    def test_decode_rejects_ids_outside_the_vocabulary(self):
        for bad in (259, -1, 100000):
            with self.subTest(id=bad):
                with self.assertRaises(ValueError):
                    decode_bytes([72, bad])

    def test_invalid_utf8_is_replaced_by_default_and_raises_when_strict(self):
        self.assertEqual(decode_bytes([72, 0xFF, 105]), "H\ufffdi")
        with self.assertRaises(UnicodeDecodeError):
            decode_bytes([0xFF], errors="strict")

    def test_stream_decoder_emits_a_character_split_across_chunks_once_whole(self):
        ids = encode_bytes("a日b")  # 61 E6 97 A5 62
        decoder = ByteStreamDecoder()
        pieces = [decoder.decode(ids[0:2]), decoder.decode(ids[2:3]), decoder.decode([EOS_ID]),
                  decoder.decode(ids[3:]), decoder.flush()]
        self.assertEqual(pieces, ["a", "", "", "日b", ""])

    def test_stream_decoder_flush_replaces_a_truncated_character(self):
        decoder = ByteStreamDecoder()
        self.assertEqual(decoder.decode([0xE6, 0x97]), "")
        self.assertEqual(decoder.flush(), "\ufffd")


if __name__ == "__main__":
    unittest.main()
