"""What the client returns: plain frozen dataclasses and str enums, no protos."""

import dataclasses
import enum
from typing import Optional, Tuple


class FinishReason(str, enum.Enum):
    """Why generation ended (proto FinishReason). A str: compares equal to its value."""

    UNSPECIFIED = "unspecified"  # also any value this client does not know
    STOP = "stop"  # an EOS id, a stop token id or a stop sequence
    LENGTH = "length"  # max_tokens reached, or the model's context is full
    ABORT = "abort"  # Abort(), or the client cancelled the stream
    ERROR = "error"  # failed after generation started: see error_message


class ResumeKind(str, enum.Enum):
    """How the prompt's state was obtained (proto ResumeKind)."""

    UNSPECIFIED = "unspecified"
    COLD = "cold"  # nothing usable cached: the whole prompt was prefilled
    GRID_CHECKPOINT = "grid_checkpoint"  # resumed from a grid checkpoint
    EXACT_PREFIX = "exact_prefix"  # resumed from an exact-prefix snapshot


@dataclasses.dataclass(frozen=True)
class TopLogprob:
    token_id: int
    logprob: float


@dataclasses.dataclass(frozen=True)
class TokenChunk:
    """Tokens as one stream message delivered them.

    logprobs: parallel to token_ids when return_logprobs was set, else None.
    top_logprobs: one tuple of alternatives per token when top_logprobs > 0,
      else None.
    """

    token_ids: Tuple[int, ...]
    logprobs: Optional[Tuple[float, ...]] = None
    top_logprobs: Optional[Tuple[Tuple[TopLogprob, ...], ...]] = None
    # For a call with text (text=, chat()): the text these ids complete (a
    # character whose bytes are split across chunks comes whole, with the
    # later chunk); else None.
    text: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class SessionOutcome:
    """The turn-end state's retention (proto SessionOutcome)."""

    published: bool  # the next turn can resume from it
    keep_seconds: "float | None"  # the TTL granted; None: the cache's default
    pinned: bool
    pin_refused_reason: str  # why a requested pin was not granted


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    # Prompt tokens whose state came from the cache (not prefilled).
    cached_tokens: int
    # Prompt tokens whose KV pages were cached but were prefilled again because
    # no SSM state existed deeper (kv match depth minus resume point).
    recomputed_tokens: int
    resume_kind: ResumeKind
    # What became of the turn-end state; None when the request did not end
    # normally (nothing is published then).
    session: "SessionOutcome | None" = None


@dataclasses.dataclass(frozen=True)
class GenerateResult:
    """A finished Generate call: every token, and the server's `complete`.

    A generation that failed after it started is a result, not an exception:
    finish_reason ERROR with error_message, and the tokens generated before.

    stop_token_id: for finish_reason STOP, the id that ended generation, or -1
      when a stop sequence did; None otherwise.
    ttft_seconds: from the call to the first chunk holding a token, on the
      client's monotonic clock; None when no token came.
    total_seconds: from the call to the `complete` message.
    """

    request_id: str
    token_ids: Tuple[int, ...]
    logprobs: Optional[Tuple[float, ...]]
    top_logprobs: Optional[Tuple[Tuple[TopLogprob, ...], ...]]
    finish_reason: FinishReason
    usage: Usage
    stop_token_id: Optional[int]
    error_message: str
    ttft_seconds: Optional[float]
    total_seconds: float
    # For a call with text (text=, chat()): token_ids decoded, special tokens
    # (an end-of-turn token) left out; else None.
    text: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class SpecialToken:
    id: int
    text: str  # e.g. "<|im_end|>"; "" when the model directory has no tokenizer file naming it


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    model_name: str  # a name (e.g. "default", "nvidia/Nemotron-H-8B-Base-8K"), never a path
    vocab_size: int
    max_context_tokens: int
    eos_token_ids: Tuple[int, ...]
    chunk_size: int  # SSD chunk size: the absolute grid of checkpoints
    page_size: int  # KV page size in tokens
    checkpoint_interval: int  # between grid checkpoints, a multiple of chunk_size
    fingerprint: str  # hex of the model fingerprint
    # The tokens that end a turn (generation_config.json, tokenizer_config.json,
    # else config.json's eos ids): chat() stops at them.
    end_of_turn_tokens: Tuple[SpecialToken, ...] = ()
