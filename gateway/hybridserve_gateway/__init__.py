"""hybridserve's OpenAI-compatible HTTP gateway: /v1/chat/completions,
/v1/completions and /v1/models in front of decode's Generation service.

    hybridserve-gateway --decode=127.0.0.1:50051 --model_dir=/models/default

Text in and out through the model directory's tokenizer (hybridserve_client's
tokenizer: Hugging Face `tokenizers`, the chat template rendered with jinja2
as transformers renders it); HTTP by granian, SSE by sse-starlette, requests
by FastAPI; decode over grpc.aio. See gateway/README.md.
"""

__version__ = "0.1.0"
