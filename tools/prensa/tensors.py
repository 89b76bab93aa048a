"""Tensors every Triton caller builds the same way: the gateway, `prensa embed-corpus` and the bench."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


def texts_tensor(texts: Sequence[str]) -> npt.NDArray[Any]:
    """A BYTES column `[n, 1]` of UTF-8 texts: what a prensa ensemble's `text` and `text_pair` take."""
    column = np.empty((len(texts), 1), dtype=object)
    column[:, 0] = [text.encode("utf-8") for text in texts]
    return column
