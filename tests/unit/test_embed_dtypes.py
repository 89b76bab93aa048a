"""vLLM's `embed_dtype` and `endianness`: base64 vectors written as torch casts and lays them out."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from prensa.gateway.core.encodings import EMBED_DTYPES, base64_vector

TORCH_TYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
               "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# views of torch's types as integers of their width, whose bytes numpy can swap
WIDTHS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def torch_bytes(vector: np.ndarray, dtype: str, endianness: str) -> bytes:
    cast = torch.from_numpy(vector).to(TORCH_TYPES[dtype])
    raw = cast.view(WIDTHS[cast.element_size()]).numpy()
    return (raw.byteswap() if endianness == "big" else raw).tobytes()


@pytest.mark.parametrize("endianness", ["little", "big", "native"])
@pytest.mark.parametrize("dtype", list(EMBED_DTYPES))
def test_base64_bytes_equal_torchs_cast(dtype, endianness):
    assert set(EMBED_DTYPES) == set(TORCH_TYPES)
    rng = np.random.default_rng(3)
    # unit vectors, and values on the rounding boundaries of every type
    vector = np.concatenate([rng.standard_normal(1021), [1 + 2**-8, 1 + 3 * 2**-9, 2**-10, -0.0, 0.3]])
    vector = (vector / np.linalg.norm(vector[:1021])).astype(np.float32)
    want = torch_bytes(vector, dtype, "little" if endianness == "native" else endianness)
    assert base64.b64decode(base64_vector(vector, dtype, endianness)) == want
