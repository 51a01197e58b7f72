"""The gateway's text pieces against their one-shot definitions, on random
inputs cut at random places:

- the stream decoder (the tokenizer's stream_decoder()): the pieces it emits concatenate to the tokenizer's
  decode of all ids (invalid UTF-8 and characters split across tokens
  included), and no piece ever ends inside a character (no U+FFFD the
  whole decode does not have at that place);
- StopMatcher: the released text is the text up to the first occurrence of
  any stop string (all of it when none occurs), however it is chunked;
- the API keys file's parser and the cache salt.
"""

import os
import random
import unittest

from hybridserve_gateway import keys
from hybridserve_gateway.service import cache_salt
from hybridserve_gateway.text import StopMatcher, Text


def _runfile(relative):
    return os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "hybridserve"), relative)


def _chunks(rng, items):
    out, i = [], 0
    while i < len(items):
        n = rng.randint(1, 4)
        out.append(items[i:i + n])
        i += n
    return out


def _utf8_heavy_bytes(rng, n):
    """Bytes mostly of valid multi-byte UTF-8, with stray continuation and lead bytes."""
    out = bytearray()
    while len(out) < n:
        r = rng.random()
        if r < 0.4:
            out += rng.choice(["a", " ", "é", "ö", "✓", "日本", "😀", "\n"]).encode()
        elif r < 0.8:
            out.append(rng.randrange(0x20, 0x7F))
        else:
            out.append(rng.choice([0x80, 0xBF, 0xC3, 0xE6, 0xF0, 0xFF]))
    return list(out[:n])


class DetokenizerTest(unittest.TestCase):

    def check(self, text, ids_of):
        rng = random.Random(5)
        for trial in range(300):
            ids = ids_of(rng)
            detok = text.detokenizer()
            pieces = [detok.decode(chunk) for chunk in _chunks(rng, ids)] + [detok.flush()]
            whole = text.decode(ids)
            self.assertEqual("".join(pieces), whole, (trial, ids))
            # Each prefix emitted so far is a prefix of the whole text.
            so_far = ""
            for piece in pieces:
                so_far += piece
                self.assertTrue(whole.startswith(so_far), (trial, ids, pieces))

    def test_hugging_face_byte_level_tokenizer(self):
        text = Text(_runfile("tests/fixtures/byte_tokenizer"))
        self.assertFalse(text.is_bytes)
        self.check(text, lambda rng: _utf8_heavy_bytes(rng, rng.randint(0, 40)) +
                   ([258] if rng.random() < 0.3 else []))

    def test_byte_vocabulary(self):
        text = Text(_runfile("models/default"))
        self.assertTrue(text.is_bytes)
        self.check(text, lambda rng: _utf8_heavy_bytes(rng, rng.randint(0, 40)))

    def test_a_split_character_is_held_until_complete(self):
        text = Text(_runfile("models/default"))
        detok = text.detokenizer()
        self.assertEqual(detok.decode([0xE2]), "")
        self.assertEqual(detok.decode([0x9C]), "")
        self.assertEqual(detok.decode([0x93]), "✓")
        self.assertEqual(detok.decode([0xE6]), "")
        self.assertEqual(detok.flush(), "\ufffd")  # never completed: as the whole decode shows it

    def test_token_text_and_bytes(self):
        hf = Text(_runfile("tests/fixtures/byte_tokenizer"))
        self.assertEqual(hf.token_text(ord("a")), ("a", [97]))
        self.assertEqual(hf.token_text(0xC3), ("\ufffd", [0xC3]))  # part of a character: its byte
        self.assertEqual(hf.token_text(258)[0], "<eos>")
        raw = Text(_runfile("models/default"))
        self.assertEqual(raw.token_text(0xE2), ("\ufffd", [0xE2]))


class StopMatcherTest(unittest.TestCase):

    def test_cut_at_the_first_stop_however_chunked(self):
        rng = random.Random(11)
        alphabet = "abcE ND\n✓"
        for trial in range(2000):
            stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
            hits = [text.find(s) for s in stops if s in text]
            expected = text[:min(hits)] if hits else text
            matcher = StopMatcher(stops)
            released, stopped = "", False
            i = 0
            while i < len(text) and not stopped:
                n = rng.randint(1, 5)
                out, stopped = matcher.feed(text[i:i + n])
                released += out
                i += n
            if not stopped:
                released += matcher.flush()
            self.assertEqual(released, expected, (trial, stops, text))
            self.assertEqual(stopped, bool(hits), (trial, stops, text))

    def test_no_stops_releases_everything(self):
        matcher = StopMatcher([])
        self.assertEqual(matcher.feed("abc"), ("abc", False))


class KeysAndSaltTest(unittest.TestCase):

    def test_parse(self):
        digest = keys.hash_key("k1")
        self.assertEqual(keys.parse("# c\n\nsha256:%s acme\n" % digest), {digest: "acme"})
        for bad in ("k1 acme", "sha256:%s" % digest, "sha256:%s a b" % digest, "sha256:%s %s" % (digest, "x" * 300),
                    "sha256:%s a\nsha256:%s b" % (digest, digest), "sha256:%s a" % digest.upper()):
            with self.assertRaises(ValueError):
                keys.parse(bad)

    def test_cache_salt(self):
        self.assertEqual(cache_salt("", None, None), "")
        salts = {cache_salt(t, u, k) for t, u, k in [("a", None, None), ("b", None, None), ("a", "u", None),
                                                      ("a", None, "u"), ("a", "u", "k"), ("", "a", None)]}
        self.assertEqual(len(salts), 6)
        self.assertEqual(cache_salt("a", "u", "k"), cache_salt("a", "u", "k"))


if __name__ == "__main__":
    unittest.main()
