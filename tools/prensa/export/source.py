"""Find a model's files: a local directory, or a Hugging Face id (downloaded or from the cache)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

# What an export reads; skips duplicate weight formats (onnx/, tf, flax) that can be gigabytes.
HUB_PATTERNS = [
    "*.json",
    "*.txt",
    "*.model",
    "*.pt",
    "*.safetensors",
    "*pytorch_model.bin",
    "1_Pooling/*",
]
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".onnx", ".json", ".model")


class SourceError(ValueError):
    """The model cannot be found or is incomplete; the message says what to do."""


@dataclass(frozen=True)
class SourceModel:
    path: Path
    name: str
    revision: str

    def has(self, relative: str) -> bool:
        return (self.path / relative).exists()


def content_revision(directory: Path) -> str:
    """A short hash over a local directory's weight and config files (no Hub commit to cite)."""
    digest = hashlib.sha256()
    for path in sorted(
        p for p in directory.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES
    ):
        digest.update(str(path.relative_to(directory)).encode())
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return "local-" + digest.hexdigest()[:16]


def cached_hub_model(model_id: str) -> Path | None:
    """The Hugging Face cache snapshot of `model_id`, if one is present; never touches the network."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, allow_patterns=HUB_PATTERNS, local_files_only=True))
    except Exception:  # noqa: BLE001 - absent from the cache, or not a valid id
        return None


def resolve_source(source: str, revision: str | None = None) -> SourceModel:
    local = Path(source).expanduser()
    if local.is_dir():
        # a static embedding model has only sentence-transformers' modules.json
        if not any(
            (local / name).exists() for name in ("config.json", "model.onnx", "modules.json")
        ):
            raise SourceError(
                f"{local} has neither config.json, model.onnx nor modules.json: not a model directory"
            )
        return SourceModel(local.resolve(), source, content_revision(local))
    if local.exists() or source.startswith((".", "/")):
        raise SourceError(f"{source} is not a directory")
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(source, revision=revision, allow_patterns=HUB_PATTERNS))
    except Exception as exc:
        raise SourceError(
            f"could not get {source!r} from the Hugging Face Hub or its cache ({type(exc).__name__}); "
            "download it elsewhere and pass the local directory instead"
        ) from exc
    return SourceModel(path, source, path.name)
