"""TEI's gRPC API (package `tei.v1`) served by the gateway (`--tei-grpc-port`).

`tei.proto` is text-embeddings-inference's own `proto/tei.proto`, unchanged (huggingface/
text-embeddings-inference at 0d124dc9773be6ac5a9a57d8439aba9bbbf33273), so TEI's gRPC clients work
unchanged. `tei_pb2.py`, `tei_pb2.pyi` and `tei_pb2_grpc.py` are generated from it and checked in
(a serving host needs no protoc); ruff and mypy skip them (pyproject.toml). To regenerate them, from
the repository root, with the grpcio-tools whose protobuf requirement the installed protobuf meets
(1.81.1 for protobuf 6.33, grpcio 1.85):

    .venv/bin/pip install grpcio-tools==1.81.1
    cd tools && ../.venv/bin/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \\
        --grpc_python_out=. prensa/gateway/grpc/tei.proto

`server` starts and stops the grpc.aio server in the gateway's event loop and `calls` holds what
every RPC shares (API key, model choice, metrics, access log, errors as gRPC statuses, streams in
order). TEI's messages become the same asks the HTTP routes run in its dialect's folder,
`prensa.gateway.apis.tei.grpc`, as every other dialect's bodies do.
"""
