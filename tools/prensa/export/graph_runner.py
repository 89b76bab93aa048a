"""An exported graph run on onnxruntime's CPU provider, one text (or pair) at a time: what the int8
checks and the calibration compare against."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt


class GraphRunner:
    """Runs a graph one text (or pair) at a time: int8 results depend on batch neighbours."""

    def __init__(self, path: Path, inputs: list[str]) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.inputs = inputs

    def __call__(self, encoded: Mapping[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
        values = self.session.run(None, {n: encoded[n].astype(np.int64) for n in self.inputs})
        return {meta.name: value for meta, value in zip(self.session.get_outputs(), values)}
