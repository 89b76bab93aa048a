"""Where the Python-backend stage code lives, and its modules as prensa sees them.

Stage code sits in `prensa/ensembles/`, package data that ships in the wheel (not a Python
package: Triton imports each file on its own), so that it can be copied verbatim into a model
repository; prensa imports the same files (the tensor contract, the pooling maths) instead of
keeping second copies.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from prensa.ensembles import prensa_stage as contract

__all__ = [
    "CONTRACT_FILE",
    "ENSEMBLES_DIR",
    "PIPELINE_STAGES",
    "contract",
    "load_stage",
    "stage_model_file",
    "stage_model_name",
    "stage_module_name",
    "stage_of_model",
]

ENSEMBLES_DIR = Path(__file__).resolve().parent / "ensembles"
CONTRACT_FILE = ENSEMBLES_DIR / "prensa_stage.py"
# the ensemble's steps in order; `fused` runs all three
PIPELINE_STAGES = (
    "tokenize",
    "encode",
    "pool",
)


def stage_model_name(model: str, stage: str) -> str:
    """The Triton model that runs `stage` of the ensemble `model`: `<model>_<stage>`."""
    return f"{model}_{stage}"


def stage_of_model(name: str) -> str | None:
    """The stage a Triton model named by `stage_model_name` runs, None for any other name."""
    return next((stage for stage in PIPELINE_STAGES if name.endswith(f"_{stage}")), None)


def stage_model_file(stage: str) -> Path:
    return ENSEMBLES_DIR / stage / "model.py"


def _import(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"missing {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses in stage code look their module up here
    spec.loader.exec_module(module)
    return module


def stage_module_name(stage: str) -> str:
    """The module name a stage's code has in prensa, and beside the fused model in a repository."""
    return f"prensa_stage_{stage}"


def load_stage(stage: str) -> ModuleType:
    """A stage's model.py with its siblings importable as inside Triton: `prensa_stage` (the one
    `contract` module), and for the fused model the three stages it runs."""
    if stage == "fused":
        for part in PIPELINE_STAGES:
            load_stage(part)
    return _import(stage_module_name(stage), stage_model_file(stage))


# The stage code imports the contract as `prensa_stage`, the name a repository gives the file
# beside each stage; prensa imports it as the typed module it is and lends it that name, so that
# both see one module (its dataclasses and constants, once).
sys.modules.setdefault("prensa_stage", contract)
