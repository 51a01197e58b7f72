"""Text in and out: prompts and conversations to token ids, generated ids to
text as they stream, stop strings matched on that text.

The tokenizer is hybridserve_client's (load_tokenizer): a model directory's
tokenizer.json through Hugging Face `tokenizers` and its chat template through
jinja2 as transformers renders it, or the byte vocabulary of the embedded
default model.
"""

import json

from hybridserve_client.tokenizer import ByteTokenizer, load_tokenizer

class Text:
    """One model's text side. Immutable; safe to share between requests."""

    def __init__(self, model_dir):
        self.tokenizer = load_tokenizer(model_dir)
        self.is_bytes = isinstance(self.tokenizer, ByteTokenizer)
        self._hf = None if self.is_bytes else self.tokenizer._tokenizer  # pylint: disable=protected-access
        self._byte_decoder = _byte_level_decoder(self._hf) if self._hf is not None else None
        self._token_text = {}

    def encode_prompt(self, text):
        """A completion prompt's ids, with the special tokens the tokenizer adds (e.g. <bos>)."""
        return self.tokenizer.encode(text)

    def encode_chat(self, messages, tools=None, template_kwargs=None):
        """A conversation's ids, ready for the assistant's reply (the chat template's rendering)."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools,
                                                  **(template_kwargs or {}))

    def decode(self, token_ids):
        return self.tokenizer.decode(token_ids)

    def detokenizer(self):
        """Text of generated ids as they stream (decode(ids) -> new text, then
        flush()), never splitting a character: the tokenizer's stream decoder."""
        return self.tokenizer.stream_decoder()

    def token_text(self, token_id):
        """(text, bytes) of one token for logprobs: its own text, and its bytes
        (a byte-level token's raw bytes, which may be part of a character)."""
        cached = self._token_text.get(token_id)
        if cached is None:
            cached = self._token_text[token_id] = self._compute_token_text(token_id)
        return cached

    def _compute_token_text(self, token_id):
        if self.is_bytes:
            raw = bytes([token_id]) if 0 <= token_id < 256 else b""
            return raw.decode("utf-8", errors="replace"), list(raw)
        piece = self._hf.id_to_token(token_id)
        if piece is None:
            return "", []
        if self._byte_decoder is not None and all(c in self._byte_decoder for c in piece):
            raw = bytes(self._byte_decoder[c] for c in piece)
            return raw.decode("utf-8", errors="replace"), list(raw)
        text = self._hf.decode([token_id], skip_special_tokens=False)
        return text, list(text.encode("utf-8"))


class StopMatcher:
    """Stop strings matched on the generated text, across token boundaries.

    feed(text) returns (text safe to release, stopped): text that cannot be
    the start of a stop string is released at once; a tail that could be is
    held until it can be told apart. On a match the text before it is
    released and the stop string and everything after it are dropped (as
    OpenAI's API does). Not thread-safe.
    """

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self._pending = ""
        self.stopped = False

    def feed(self, text):
        if self.stopped:
            return "", True
        if not self.stops:
            return text, False
        self._pending += text
        first = None
        for s in self.stops:
            at = self._pending.find(s)
            if at >= 0 and (first is None or at < first):
                first = at
        if first is not None:
            out = self._pending[:first]
            self._pending = ""
            self.stopped = True
            return out, True
        # Release all but the longest tail that is a prefix of some stop string.
        keep = 0
        for n in range(min(self._hold, len(self._pending)), 0, -1):
            tail = self._pending[-n:]
            if any(s.startswith(tail) for s in self.stops):
                keep = n
                break
        out = self._pending[:len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep:]
        return out, False

    def flush(self):
        """What is held when generation ended without a match."""
        out, self._pending = self._pending, ""
        return out


def _byte_level_decoder(hf):
    """GPT-2's byte-to-character map inverted, when the tokenizer decodes with
    ByteLevel (its tokens are strings of those characters); else None."""
    decoder = json.loads(hf.to_str()).get("decoder") or {}
    kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders") or []]
    if "ByteLevel" not in kinds:
        return None
    # bytes_to_unicode: printable Latin-1 bytes stand for themselves, the rest for 256 + n.
    byte_values = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = byte_values[:]
    n = 0
    for b in range(256):
        if b not in byte_values:
            byte_values.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(byte_values, chars)}
