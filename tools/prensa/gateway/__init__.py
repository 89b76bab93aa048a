"""The HTTP gateway: TEI's native API, OpenAI `/v1/embeddings` and `/v1/models`, Cohere's and
Jina's rerank and embed, and NIM's ranking, in front of Triton.

`app` (factory, middleware, error handlers) -> `routes_tei` / `routes_openai` / `routes_cohere` /
`routes_nim` (HTTP only, with `responses` for shared plumbing) -> `service` (request -> Triton ->
result, no HTTP) -> `triton_client` (gRPC aio). `protocol_*` hold the pydantic shapes, `errors` the
one table of error kinds, `models` the served-model registry and which model a request names,
`prompts` the sentence-transformers prompts, `quantize` the embedding precisions, `tokenization`
the gateway-side truncation, `limits` admission, `metrics` the Prometheus series and `settings`
the flags.
"""
