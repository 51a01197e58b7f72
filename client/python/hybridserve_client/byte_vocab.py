"""The byte-level vocabulary of the default model (models/default, tools/gen_model.py).

Ids 0..255 are the bytes themselves, 256 <pad>, 257 <bos>, 258 <eos>;
vocab_size 259. Other models bring their own tokenizer: these helpers are for
this vocabulary only.
"""

import codecs

NUM_BYTES = 256
PAD_ID = 256
BOS_ID = 257
EOS_ID = 258
VOCAB_SIZE = 259
SPECIAL_IDS = frozenset((PAD_ID, BOS_ID, EOS_ID))


def encode_bytes(text, add_bos=False):
    """Token ids of `text` (str, encoded as UTF-8, or bytes), <bos> first if add_bos."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return ([BOS_ID] if add_bos else []) + list(data)


def _byte_values(token_ids):
    out = bytearray()
    for i in token_ids:
        if 0 <= i < NUM_BYTES:
            out.append(i)
        elif i not in SPECIAL_IDS:
            raise ValueError("token id %d is outside the byte vocabulary [0, %d)" % (i, VOCAB_SIZE))
    return bytes(out)


def decode_bytes(token_ids, errors="replace"):
    """Text of `token_ids`, skipping <pad>, <bos> and <eos>.

    Invalid UTF-8 (a sampled byte sequence need not be valid) is handled per
    `errors`, as in bytes.decode: "replace" (U+FFFD), "strict", "ignore".

    Raises:
      ValueError: an id outside the vocabulary.
    """
    return _byte_values(token_ids).decode("utf-8", errors)


class ByteStreamDecoder:
    """Decodes ids arriving in chunks: a UTF-8 character split across two chunks
    is emitted whole, once its last byte arrives. Not thread-safe.
    """

    def __init__(self, errors="replace"):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors)

    def decode(self, token_ids):
        """Text completed by these ids (possibly empty)."""
        return self._decoder.decode(_byte_values(token_ids))

    def flush(self):
        """Text of any bytes still pending (an incomplete character): call at the end."""
        return self._decoder.decode(b"", final=True)
