# The prensa gateway: HTTP APIs in front of Triton's gRPC port. The built wheel with its core
# dependencies only (no extra): no torch, transformers, onnx or TensorRT, which only exports need.
# The wheel carries the stage contract the gateway reads (prensa/ensembles, package data).
# Build context: the repository root (compose.yaml sets it).
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tools/prensa ./tools/prensa
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir /wheels/prensa-*.whl && rm -rf /wheels
EXPOSE 8080
