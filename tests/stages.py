"""Import a stage's `model.py` the way Triton does: its folder and the contract on sys.path."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from prensa.stages import ENSEMBLES_DIR, stage_model_file


def load_stage(stage: str) -> ModuleType:
    if str(ENSEMBLES_DIR) not in sys.path:
        sys.path.insert(0, str(ENSEMBLES_DIR))  # provides `prensa_stage`, as the copied sibling does
    spec = importlib.util.spec_from_file_location(f"stage_{stage}", stage_model_file(stage))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
