"""The GPU tier: what only a CUDA GPU can tell (docs/gpu.md). Every test here skips, naming what
is missing, on a machine without one (CI has none); `tools/gpu_check.sh` installs what the tier
needs on a GPU machine and runs it before its benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest

from prensa.export.pipeline import ExportFormat, ExportOptions, export_model
from prensa.manifest import Task

CUDA = "CUDAExecutionProvider"


@pytest.fixture(scope="session")
def cuda() -> None:
    """Skips unless torch sees a CUDA GPU and onnxruntime has its CUDA provider."""
    from prensa.export.formats.tensorrt import missing_cuda

    if missing := missing_cuda():
        pytest.skip(f"the GPU tier needs {missing}")
    import onnxruntime as ort

    if CUDA not in ort.get_available_providers():
        pytest.skip(f"onnxruntime {ort.__version__} has no {CUDA} (onnxruntime-gpu; tools/gpu_check.sh installs it)")
    if hasattr(ort, "preload_dlls"):  # CUDA and cuDNN from the nvidia-* wheels
        ort.preload_dlls()


@pytest.fixture(scope="session")
def gpu_sources(cuda: None, tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> dict[str, tuple[str, Task | None]]:
    """The models the tier exports: all-MiniLM-L6-v2 (real weights), and tiny bge-m3 and
    bge-reranker-v2-m3 layouts."""
    from tests.tiny_models import tiny_bge_m3, tiny_reranker

    root = tmp_path_factory.mktemp("gpu")
    return {"minilm": (str(minilm_dir), Task.EMBED), "tiny-m3": (str(tiny_bge_m3(root / "tiny-m3-src")), None),
            "tiny-reranker": (str(tiny_reranker(root / "tiny-reranker-src")), None)}


@pytest.fixture(scope="session")
def gpu_export(gpu_sources: dict[str, tuple[str, Task | None]], tmp_path_factory: pytest.TempPathFactory):
    """`gpu_export(model, format, dtype)`: the export's directory and its verify report, made once."""
    made: dict[tuple[str, ExportFormat, str], tuple[Path, object]] = {}

    def export(model: str, fmt: ExportFormat, dtype: str) -> tuple[Path, object]:
        key = (model, fmt, dtype)
        if key not in made:
            source, task = gpu_sources[model]
            out = tmp_path_factory.mktemp("gpu") / f"{model}-{fmt.value}-{dtype}"
            _, report = export_model(ExportOptions(source, out, task=task, format=fmt, dtype=dtype, trt_max_batch=32))
            made[key] = (out, report)
        return made[key]

    return export
