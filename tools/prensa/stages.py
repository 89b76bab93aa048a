"""Where the Python-backend stage code lives, and its tensor contract as a module.

Stage code sits in the top-level `ensembles/` folder so that it can be copied verbatim into a
model repository; prensa reads the same contract file instead of keeping a second copy.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ENSEMBLES_DIR = Path(__file__).resolve().parents[2] / "ensembles"
CONTRACT_FILE = ENSEMBLES_DIR / "prensa_stage.py"
STAGES = ("tokenize", "encode", "pool")


def stage_model_file(stage: str) -> Path:
    return ENSEMBLES_DIR / stage / "model.py"


def _load_contract() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prensa_stage", CONTRACT_FILE)
    assert spec is not None and spec.loader is not None, f"missing {CONTRACT_FILE}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


contract = _load_contract()
