"""The graph formats an export writes beside or instead of the traced ONNX graph (fused, fp16, int8,
packed, TensorRT), how they are stored, and what is measured on them (calibration)."""
