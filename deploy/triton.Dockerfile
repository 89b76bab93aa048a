# The official Triton container plus what prensa's Python-backend stages import (tokenize, pool,
# and the Python encoder of the cpu target): built once, so a restart needs no network.
# Triton 24.10 = server 2.51 (the release the nvidia-pytriton wheel ships), CUDA 12.6, cuDNN 9,
# TensorRT 10.5, Python 3.10. Engines (`model.plan`) must be built with TensorRT 10.5 to load here.
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3
FROM ${TRITON_IMAGE}
RUN pip install --no-cache-dir "numpy>=1.24,<2" "tokenizers>=0.19,<0.23" "onnxruntime-gpu>=1.19,<1.21"
