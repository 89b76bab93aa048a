"""Embedding precisions beyond float32, by sentence-transformers' `quantize_embeddings` rules.

int8/uint8 map each dimension's calibration range [min, max] onto 256 steps; the ranges are the
model's own (computed at export over a fixed corpus), so a text's codes never depend on what
else is in its batch. Values outside the range are clipped rather than wrapped around.
binary/ubinary keep the sign bits, packed eight to a byte (binary offset by -128 into int8).
base64 vectors are written in one of vLLM's `embed_dtype`s, rounded to nearest even as torch's
casts round (ml_dtypes' bfloat16 and float8 types), in the byte order asked.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Sequence
from typing import Any, Literal

import ml_dtypes
import numpy as np
import numpy.typing as npt

from prensa.gateway.errors import validation

RANGED = frozenset({"int8", "uint8"})
STEPS = 255


# vLLM's `embed_dtype` names
EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
EMBED_DTYPES: dict[str, Any] = {
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
}
# vLLM's `endianness`; native is this machine's
Endianness = Literal["native", "little", "big"]


def base64_vector(
    vector: npt.NDArray[Any], dtype: str = "float32", endianness: str = "little"
) -> str:
    """`vector`'s bytes in `dtype` and byte order, base64-encoded; the defaults are OpenAI's
    `encoding_format: base64` (little-endian float32)."""
    values = np.asarray(vector, dtype=np.float32).astype(EMBED_DTYPES[dtype])
    order = sys.byteorder if endianness == "native" else endianness
    if order != sys.byteorder:
        values = values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def quantize(
    vectors: npt.NDArray[Any], precision: str, ranges: npt.NDArray[Any] | None = None
) -> npt.NDArray[Any]:
    """`vectors` [n, dim] in `precision` (float, int8, uint8, binary, ubinary)."""
    if precision == "float":
        return vectors
    if precision in RANGED:
        if ranges is None:
            raise ValueError("int8 and uint8 need calibration ranges")
        starts = ranges[0]
        steps = np.where(ranges[1] > ranges[0], (ranges[1] - ranges[0]) / STEPS, 1.0)
        codes: npt.NDArray[Any] = np.clip((vectors - starts) / steps, 0, STEPS)
        return codes.astype(np.uint8) if precision == "uint8" else (codes - 128).astype(np.int8)
    packed = np.packbits(vectors > 0, axis=-1)
    if precision == "ubinary":
        return packed
    if precision == "binary":
        return (packed.astype(np.int16) - 128).astype(np.int8)
    raise ValueError(f"unknown precision {precision}")


def as_type(
    vectors: npt.NDArray[Any],
    kind: str,
    ranges: npt.NDArray[Any] | None,
    dtype: str = "float32",
    endianness: str = "little",
) -> Any:
    """`vectors` [n, dim] as one embedding type: base64 strings (`base64_vector`), or `quantize`'s
    arrays."""
    if kind == "base64":
        return [base64_vector(row, dtype, endianness) for row in vectors]
    return quantize(vectors, kind, ranges)


def check_ranged(
    model_name: str, ranges: npt.NDArray[Any] | None, dim: int, precisions: Sequence[str]
) -> None:
    """int8/uint8 need the model's calibration ranges, at the model's full dimension."""
    if not RANGED.intersection(precisions):
        return
    if ranges is None:
        raise validation(
            f"model `{model_name}` has no int8 calibration ranges (calibration.json in its repository); "
            "run `prensa calibrate` on its export and rebuild the repository"
        )
    if ranges.shape[-1] != dim:
        raise validation(
            "int8 and uint8 embeddings come at the model's full dimension: drop `output_dimension`"
        )
