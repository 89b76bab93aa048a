"""TensorRT engines (`model.plan`) from an ONNX export, and a small runtime to check them.

Precision lives in the graph, not in builder flags: the network is strongly typed and built from
the fp16 ONNX conversion that keeps LayerNorm and softmax in fp32 (fp16 LayerNorms overflow in
encoders). TensorRT 11 removed the weak-typing flags (`BuilderFlag.FP16`,
`OBEY_PRECISION_CONSTRAINTS`, ...) and 10.x already builds strongly typed networks, so this one
path works on both. An engine loads only in the TensorRT version that built it, on the same GPU
kind: build with the version inside the Triton container that will serve it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from prensa.manifest import EngineProfile

if TYPE_CHECKING:
    import torch

ENGINE_FILE = "model.plan"
# compose.yaml's Triton (nvcr.io/nvidia/tritonserver:24.10-py3) carries TensorRT 10.5.
SERVING_TRITON = "24.10"
SERVING_TENSORRT = "10.5"
SERVING_TENSORRT_PIP = "tensorrt-cu12==10.5.0"
WORKSPACE_BYTES = 4 << 30


class TensorRTUnavailable(RuntimeError):
    """TensorRT or a CUDA GPU is missing here; the message says which."""


class TensorRTError(RuntimeError):
    """TensorRT refused the graph, failed to build, load or run the engine; the message says which."""


def missing_tensorrt() -> str | None:
    """Why the `tensorrt` package cannot be used here, in words; None when it is installed."""
    if importlib.util.find_spec("tensorrt") is None:
        return (
            f"the `tensorrt` Python package (`pip install {SERVING_TENSORRT_PIP}`, the TensorRT of "
            f"Triton {SERVING_TRITON} in compose.yaml)"
        )
    return None


def missing_cuda() -> str | None:
    """Why torch sees no CUDA GPU here, in words; None when it does."""
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    return (
        None if cuda else "a CUDA GPU visible to torch (an NVIDIA driver and a CUDA build of torch)"
    )


def missing_requirements() -> list[str]:
    """What stops building and checking an engine on this machine, in words; empty when nothing."""
    return [reason for reason in (missing_tensorrt(), missing_cuda()) if reason]


def require_tensorrt() -> None:
    missing = missing_requirements()
    if missing:
        raise TensorRTUnavailable("--format tensorrt needs " + " and ".join(missing))


def engine_profile(
    max_length: int, max_batch: int, opt_batch: int, opt_length: int | None
) -> EngineProfile:
    """One profile from 1 x 1 to max_batch x max_length, tuned for opt_batch x opt_length."""
    opt_length = min(opt_length or 128, max_length)
    if not (1 <= opt_batch <= max_batch and 1 <= opt_length <= max_length):
        raise ValueError(
            f"TensorRT profile needs 1 <= opt <= max: batch {opt_batch}/{max_batch}, "
            f"length {opt_length}/{max_length}"
        )
    return EngineProfile(1, opt_batch, max_batch, 1, opt_length, max_length)


def describe_profile(profile: EngineProfile) -> str:
    return (
        f"batch {profile.min_batch}/{profile.opt_batch}/{profile.max_batch} x "
        f"length {profile.min_length}/{profile.opt_length}/{profile.max_length} (min/opt/max)"
    )


def build_engine(onnx_path: Path, plan_path: Path, profile: EngineProfile) -> str:
    """Parse `onnx_path` into a strongly typed network, build, write `plan_path`; returns TensorRT's version."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # resolves external data beside the file
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise TensorRTError(f"TensorRT could not parse {onnx_path.name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    shapes = builder.create_optimization_profile()
    for index in range(network.num_inputs):  # every token input is [batch, tokens]
        tensor = network.get_input(index)
        if tensor.dtype != trt.int64:  # the Triton config and the tokenize stage carry int64
            raise TensorRTError(
                f"TensorRT reads input {tensor.name} as {tensor.dtype}, prensa sends int64"
            )
        shapes.set_shape(
            tensor.name,
            (profile.min_batch, profile.min_length),
            (profile.opt_batch, profile.opt_length),
            (profile.max_batch, profile.max_length),
        )
    config.add_optimization_profile(shapes)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TensorRTError("TensorRT failed to build the engine; its log above says why")
    plan_path.write_bytes(memoryview(serialized))
    return cast(str, trt.__version__)


def _torch_dtype(trt_dtype: Any) -> torch.dtype:
    import tensorrt as trt
    import torch

    return {
        trt.float32: torch.float32,
        trt.float16: torch.float16,
        trt.int32: torch.int32,
        trt.int64: torch.int64,
        trt.bool: torch.bool,
    }[trt_dtype]


class EngineRunner:
    """One engine and execution context; torch CUDA tensors are the I/O buffers, one side stream."""

    def __init__(self, plan_path: Path) -> None:
        import tensorrt as trt
        import torch

        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)  # must outlive the engine it deserializes
        self.engine = self.runtime.deserialize_cuda_engine(plan_path.read_bytes())
        if self.engine is None:
            raise TensorRTError(
                f"{plan_path} does not load in TensorRT {trt.__version__} on this GPU"
            )
        self.context = self.engine.create_execution_context()
        self.stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch leaves Stream() unannotated
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [
            n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT
        ]

    def run(self, feed: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
        """Host arrays in, host fp32/int arrays out; synchronous."""
        import torch

        with torch.cuda.stream(self.stream):
            buffers = {}
            for name in self.inputs:
                dtype = _torch_dtype(self.engine.get_tensor_dtype(name))
                buffers[name] = torch.from_numpy(np.ascontiguousarray(feed[name])).to(
                    "cuda", dtype, non_blocking=True
                )
                self.context.set_input_shape(name, tuple(buffers[name].shape))
            for name in self.outputs:
                shape = tuple(self.context.get_tensor_shape(name))
                buffers[name] = torch.empty(
                    shape, dtype=_torch_dtype(self.engine.get_tensor_dtype(name)), device="cuda"
                )
            for name, tensor in buffers.items():
                self.context.set_tensor_address(name, tensor.data_ptr())
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise TensorRTError("TensorRT execute_async_v3 failed")
            results = {
                name: buffers[name].float() if buffers[name].is_floating_point() else buffers[name]
                for name in self.outputs
            }
        self.stream.synchronize()
        return {name: tensor.cpu().numpy() for name, tensor in results.items()}
