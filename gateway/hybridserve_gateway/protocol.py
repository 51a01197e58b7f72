"""The request bodies of /v1/chat/completions and /v1/completions, validated.

Fields as OpenAI's API reference names them, with its ranges; a value out of
range or of the wrong type is a 400 naming the parameter. Parameters OpenAI
defines that this server does not implement are refused by name when set to
anything but their no-op default (a client asking for a penalty must learn it
got none). Fields neither OpenAI nor we define are ignored, as vLLM ignores
them (clients and SDKs add their own).

Extensions (vLLM's names): top_k, ignore_eos, chat_template_kwargs.
"""

from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from .errors import invalid, unsupported

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    max_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[StrictInt] = Field(default=None, ge=-1)
    seed: Optional[StrictInt] = None
    stop: Optional[Union[str, List[str]]] = None
    stream: Optional[StrictBool] = False
    stream_options: Optional[Dict[str, Any]] = None
    n: Optional[StrictInt] = 1
    user: Optional[str] = Field(default=None, max_length=256)
    prompt_cache_key: Optional[str] = Field(default=None, max_length=1024)
    ignore_eos: Optional[StrictBool] = False
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[Dict[str, float]] = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError("at most %d stop strings" % MAX_STOP_STRINGS)
        for s in stops:
            if not s:
                raise ValueError("a stop string must not be empty")
            if len(s) > MAX_STOP_CHARS:
                raise ValueError("a stop string has at most %d characters" % MAX_STOP_CHARS)
        return v

    def stops(self):
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self):
        if self.stream_options is None:
            return False
        if not self.stream:
            raise invalid("stream_options is only allowed with stream: true", param="stream_options")
        value = self.stream_options.get("include_usage", False)
        if not isinstance(value, bool):
            raise invalid("stream_options.include_usage must be a boolean", param="stream_options.include_usage")
        return value

    def check_common(self):
        """The cross-field and unimplemented-parameter checks pydantic's field checks leave."""
        if self.n != 1:
            raise unsupported("n", "only n = 1 is supported (one choice per request)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value not in (None, 0, 0.0):
                raise unsupported(name, "%s is not supported (only 0)" % name)
        if self.logit_bias:
            raise unsupported("logit_bias", "logit_bias is not supported")
        if self.top_k == 0:
            self.top_k = None
        self.include_usage()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1)
    content: Optional[Union[str, List[Dict[str, Any]]]] = None


class ChatRequest(_Body):
    messages: List[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    logprobs: Optional[StrictBool] = False
    top_logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=20)
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    response_format: Optional[Dict[str, Any]] = None
    chat_template_kwargs: Optional[Dict[str, Any]] = None

    def check(self):
        self.check_common()
        if self.top_logprobs and not self.logprobs:
            raise invalid("top_logprobs needs logprobs: true", param="top_logprobs")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise unsupported("response_format", "response_format %r is not supported (only \"text\")" %
                              self.response_format.get("type"))
        if self.tool_choice not in (None, "none", "auto"):
            raise unsupported("tool_choice", "tool_choice other than \"none\" or \"auto\" is not supported")

    def token_limit(self):
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self):
        """The messages as the chat template takes them: a content given as
        parts becomes their text (text parts only)."""
        out = []
        for i, m in enumerate(self.messages):
            message = m.model_dump(exclude_none=True)
            if isinstance(m.content, list):
                texts = []
                for j, part in enumerate(m.content):
                    if part.get("type") != "text" or not isinstance(part.get("text"), str):
                        raise unsupported("messages[%d].content[%d]" % (i, j),
                                          "content parts of type %r are not supported (text only)" %
                                          part.get("type"))
                    texts.append(part["text"])
                message["content"] = "".join(texts)
            out.append(message)
        return out


class CompletionRequest(_Body):
    prompt: Union[str, List[str], List[StrictInt], List[List[StrictInt]]]
    logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=5)
    echo: Optional[StrictBool] = False
    suffix: Optional[str] = None
    best_of: Optional[StrictInt] = None

    def check(self):
        self.check_common()
        if self.echo:
            raise unsupported("echo", "echo is not supported")
        if self.suffix:
            raise unsupported("suffix", "suffix is not supported")
        if self.best_of not in (None, 1):
            raise unsupported("best_of", "only best_of = 1 is supported")

    def token_limit(self):
        return self.max_tokens

    def single_prompt(self):
        """The one prompt: text, or token ids."""
        p = self.prompt
        if isinstance(p, list):
            if not p:
                raise invalid("prompt must not be empty", param="prompt")
            if isinstance(p[0], (str, list)):
                if len(p) != 1:
                    raise unsupported("prompt", "one prompt per request (a list of %d given)" % len(p))
                p = p[0]
        if isinstance(p, str) and not p:
            raise invalid("prompt must not be empty", param="prompt")
        if isinstance(p, list) and not p:
            raise invalid("prompt must not be empty", param="prompt")
        return p



def param_of(loc):
    """OpenAI's param name of a pydantic error location: messages[0].role."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += "[%d]" % part
        elif part in ("str", "list[str]", "list[int]", "list[list[int]]") or "[" in str(part):
            continue  # the union branch pydantic tried, not a field
        else:
            out += ("." if out else "") + str(part)
    return out or None
