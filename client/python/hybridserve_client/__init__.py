"""Python client of hybridserve's Generation service (proto/generation.proto).

    from hybridserve_client import Client, encode_bytes, decode_bytes

    with Client("localhost:50050", timeout=60) as client:
        result = client.generate(encode_bytes("Hello"), max_tokens=32, temperature=0.0)
        print(decode_bytes(result.token_ids), result.finish_reason, result.usage)

    # Text through a model directory's tokenizer.json (pip install "client/python[text]"):
    with Client.from_model_dir("localhost:50050", "path/to/model") as client:
        print(client.chat([{"role": "user", "content": "Hello"}], max_tokens=64).text)

See client/python/README.md.
"""

from .byte_vocab import (BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteStreamDecoder, decode_bytes,
                         encode_bytes)
from .client import Client, GenerateStream
from .errors import HybridserveError, StreamProtocolError
from .results import (FinishReason, GenerateResult, ModelInfo, ResumeKind, SessionOutcome,
                      SpecialToken, TokenChunk, TopLogprob, Usage)
from .tokenizer import ByteTokenizer, ChatTemplate, HfTokenizer, load_tokenizer

__all__ = [
    "BOS_ID", "EOS_ID", "PAD_ID", "VOCAB_SIZE", "ByteStreamDecoder", "decode_bytes",
    "encode_bytes", "Client", "GenerateStream", "HybridserveError", "StreamProtocolError",
    "FinishReason", "GenerateResult", "ModelInfo", "ResumeKind", "TokenChunk", "TopLogprob",
    "SessionOutcome", "SpecialToken", "Usage", "ByteTokenizer", "ChatTemplate", "HfTokenizer", "load_tokenizer",
]
