"""The gateway: TEI's native API, OpenAI's, Cohere's, Jina's, NIM's, Ollama's, vLLM's and
Infinity's shapes, and TEI's gRPC API, in front of Triton. Its floors, each importing only those
below it:

- `workers`, `server`, `app`: the processes, the uvicorn server and the FastAPI app that assemble
  everything below (the app also starts `grpc/`'s server);
- `grpc/` (TEI's gRPC API) and `apis/<family>/` (`protocol`: pydantic shapes; `routes`: parse,
  call the core, shape the JSON);
- `http/` (the route classes and middleware every HTTP route stands on) and `state` (the
  gateway's state, which both servers share);
- `core/` (the registry of served models, `service`: per-task operations over `engine.infer`,
  tokenization, chunking, dispatch, admission limits, prompts, encodings, each request's context);
- `backends/` (Triton's gRPC client, its replicas, the in-process stage code);
- beneath them all: `settings` (the flags), `errors` (the one table of error kinds), `logs`,
  `metrics`, `tracing`, `auth`.
"""
