"""The container target's encoder: a native Triton backend on the GPU instead of the Python stage.

A TensorRT plan (`platform: tensorrt_plan`) when the export has one, else the onnxruntime
backend, optionally with TensorRT as its execution accelerator. Native backends batch only
requests whose shapes are equal (no ragged inputs here), so the tokenizer pads each request to a
length bucket and the dynamic batcher merges requests of the same bucket. The onnxruntime backend
runs the export's packed graph where the export checked it on a GPU (`served_graph`): the buckets
then cost buffers, not compute. A TensorRT engine computes every padded token of its bucket.
"""

from __future__ import annotations

from prensa.manifest import Manifest
from prensa.stages import contract
from prensa.triton.config import ConfigDict, Tensor, dynamic_batching

ACCELERATOR_WORKSPACE_BYTES = 4 << 30
WARMUP_TOKENS = 16384  # rows x length of the largest warmup batch (see warmup_shapes)


def length_buckets(max_length: int, requested: tuple[int, ...] = ()) -> list[int]:
    """Ascending pad lengths ending at `max_length`: the requested ones below it, or the contract's
    GPU ladder from NATIVE_SMALLEST_LENGTH_BUCKET. Few buckets mean more merging; each bucket
    wastes at most half its length on padding."""
    if not requested:
        return list(contract.gpu_length_buckets(max_length, contract.NATIVE_SMALLEST_LENGTH_BUCKET))
    return [*sorted({b for b in requested if 0 < b < max_length}), max_length]


def warmup_shapes(buckets: list[int], max_batch_size: int) -> list[tuple[int, int]]:
    """(rows, length) pairs a native GPU encoder runs before READY: every bucket alone, and batches
    of 4, 16, 64 ... rows up to `max_batch_size` while they hold at most WARMUP_TOKENS tokens. On
    onnxruntime CUDA a shape's first run is several times slower than its steady ones; row counts
    left out still pay that once (docs/gpu.md, "Warmup and readiness")."""
    rows = sorted({min(4**k, max_batch_size) for k in range(max_batch_size.bit_length())} | {1})
    return [
        (r, length) for length in buckets for r in rows if r == 1 or r * length <= WARMUP_TOKENS
    ]


def check_servable(manifest: Manifest, max_batch_size: int, onnx_tensorrt: bool) -> None:
    """Refuse, at build time, exports a native GPU encoder would serve wrongly or not load."""
    if onnx_tensorrt and not manifest.tensorrt and manifest.fused_ops:
        raise ValueError(
            f"the graph holds onnxruntime's fused ops ({', '.join(manifest.fused_ops)}), which TensorRT "
            "cannot take; re-export it with --no-fuse-ops for --onnx-tensorrt"
        )
    if manifest.dtype == "int8":
        raise ValueError(
            "int8 (dynamically quantised) graphs are a CPU format: their results depend on batch "
            "neighbours and their kernels run on the CPU; build them with --target cpu, or export fp32/fp16"
        )
    engine = manifest.tensorrt
    if engine and engine.profile.max_batch < max_batch_size:
        raise ValueError(
            f"the TensorRT engine accepts at most {engine.profile.max_batch} rows, the repository "
            f"--max-batch-size is {max_batch_size}: lower it or re-export with --trt-max-batch"
        )


def served_graph(manifest: Manifest, onnx_tensorrt: bool) -> str:
    """The ONNX file the onnxruntime backend loads: the packed graph where the export checked it
    against the unpacked one on CUDA (nothing here can check it at load), else the plain one; TensorRT
    as onnxruntime's accelerator takes no packed ops."""
    if manifest.packed_file and manifest.packed_checked and not onnx_tensorrt:
        return manifest.packed_file
    return manifest.onnx_file


def _shapes(inputs: list[str], batch: int, length: int) -> str:
    return ",".join(f"{name}:{batch}x{length}" for name in inputs)


def tensorrt_accelerator(manifest: Manifest, max_batch_size: int, cache_path: str) -> ConfigDict:
    """onnxruntime's TensorRT provider in fp16 (LayerNorm kept in fp32), one explicit profile
    covering every batch and bucket, and an engine cache outside the read-only repository so a
    restart loads engines instead of rebuilding them."""
    opt_batch, opt_length = min(8, max_batch_size), min(128, manifest.max_length)
    parameters = {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": str(ACCELERATOR_WORKSPACE_BYTES),
        "trt_layer_norm_fp32_fallback": "true",
        "trt_engine_cache_enable": "true",
        "trt_engine_cache_path": cache_path,
        "trt_profile_min_shapes": _shapes(manifest.inputs, 1, 1),
        "trt_profile_opt_shapes": _shapes(manifest.inputs, opt_batch, opt_length),
        "trt_profile_max_shapes": _shapes(manifest.inputs, max_batch_size, manifest.max_length),
    }
    return {
        "execution_accelerators": {
            "gpu_execution_accelerator": [{"name": "tensorrt", "parameters": parameters}]
        }
    }


def encoder_config(
    name: str,
    manifest: Manifest,
    max_batch_size: int,
    queue_delay_us: int,
    max_queue_size: int,
    instances: int,
    warmup: list[ConfigDict],
    accelerator_cache: str | None,
) -> ConfigDict:
    """`accelerator_cache` set: onnxruntime graphs get the TensorRT accelerator, caching engines there."""
    config: ConfigDict = {
        "name": name,
        "max_batch_size": max_batch_size,
        "input": [Tensor(n, contract.triton_type(n), [-1]).as_input() for n in manifest.inputs],
        "output": [
            Tensor(o.name, contract.ENCODER_OUTPUT_TYPE.triton, o.dims).as_output()
            for o in manifest.outputs
        ],
        "dynamic_batching": dynamic_batching(queue_delay_us, max_queue_size),
        "instance_group": [{"count": instances, "kind": "KIND_GPU"}],
        # Warm before READY: the plan's context (or onnxruntime's CUDA/TensorRT session) is set up
        # and run on the shapes of warmup_shapes, so first client requests do not pay for them.
        "model_warmup": warmup,
    }
    if manifest.tensorrt:
        config.update(platform="tensorrt_plan", default_model_filename=manifest.tensorrt.file)
    else:
        config.update(
            backend="onnxruntime",
            default_model_filename=served_graph(manifest, accelerator_cache is not None),
        )
        if accelerator_cache:
            config["optimization"] = tensorrt_accelerator(
                manifest, max_batch_size, accelerator_cache
            )
    return config
