# The prensa gateway: HTTP APIs in front of Triton's gRPC port. It imports no torch, onnx or
# TensorRT, so the package goes in without its export dependencies and only the serving ones
# are added. Editable, because prensa reads the stage contract from ensembles/ beside tools/.
# Build context: the repository root (compose.yaml sets it).
FROM python:3.11-slim
WORKDIR /opt/prensa
COPY pyproject.toml README.md ./
COPY tools ./tools
COPY ensembles ./ensembles
RUN pip install --no-cache-dir --no-deps -e . \
 && pip install --no-cache-dir "numpy>=1.24,<2" "tokenizers>=0.19" "tritonclient[grpc,http]>=2.51" "protobuf>=4" \
      "typer>=0.12" "rich>=13" fastapi uvicorn uvloop httptools psutil pydantic orjson prometheus-client \
      opentelemetry-sdk opentelemetry-exporter-otlp-proto-grpc opentelemetry-exporter-otlp-proto-http
EXPOSE 8080
