"""The HTTP gateway: OpenAI `/v1/embeddings` and TEI's native API in front of Triton.

`app` (factory, middleware, error handlers) -> `routes_openai` / `routes_tei` (HTTP only, with
`responses` for shared plumbing) -> `service` (request -> Triton -> result, no HTTP) ->
`triton_client` (gRPC aio). `protocol_*` hold the pydantic shapes, `errors` the one table of
error kinds, `models` the served-model registry, `tokenization` the gateway-side truncation,
`pooling` the pool stage's own numpy code, `limits` admission, `metrics` the Prometheus series
and `settings` the flags.
"""
