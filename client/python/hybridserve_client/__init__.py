"""Python client of hybridserve's Generation service (proto/generation.proto).

    from hybridserve_client import Client, encode_bytes, decode_bytes

    with Client("localhost:50061", timeout=60) as client:
        result = client.generate(encode_bytes("Hello"), max_tokens=32, temperature=0.0)
        print(decode_bytes(result.token_ids), result.finish_reason, result.usage)

See client/python/README.md.
"""

from .byte_vocab import (BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteStreamDecoder, decode_bytes,
                         encode_bytes)
from .client import Client, GenerateStream
from .errors import HybridserveError, StreamProtocolError
from .results import (FinishReason, GenerateResult, ModelInfo, ResumeKind, TokenChunk,
                      SessionOutcome, TopLogprob, Usage)

__all__ = [
    "BOS_ID", "EOS_ID", "PAD_ID", "VOCAB_SIZE", "ByteStreamDecoder", "decode_bytes",
    "encode_bytes", "Client", "GenerateStream", "HybridserveError", "StreamProtocolError",
    "FinishReason", "GenerateResult", "ModelInfo", "ResumeKind", "TokenChunk", "TopLogprob",
    "SessionOutcome", "Usage",
]
