"""The pool stage's own numpy functions, loaded from `ensembles/pool/model.py`.

The gateway pools only when Triton's pool stage cannot give what was asked (`normalize: false`
on a model whose stage normalises): it then runs the encoder through Triton and pools here with
the very function the stage uses, so the two never drift apart.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from prensa.stages import contract, stage_model_file


def _load_pool_stage() -> ModuleType:
    sys.modules.setdefault("prensa_stage", contract)  # what the stage imports beside itself in Triton
    spec = importlib.util.spec_from_file_location("prensa_pool_stage", stage_model_file("pool"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_stage = _load_pool_stage()
pool_tokens = _stage.pool_tokens
l2_normalize = _stage.l2_normalize
