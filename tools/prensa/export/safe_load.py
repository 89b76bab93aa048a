"""Load a model directory's weights without ever running code it ships.

`pytorch_model.bin` and `*.pt` files are pickles, and unpickling may call any function. So an
export reads safetensors whenever the directory has them, and otherwise only pickles that torch's
`weights_only` unpickler accepts (tensors and plain containers); remote code is never trusted.
transformers already unpickles with `weights_only=True` by default; prensa asks for it
explicitly, so an upgrade cannot change it silently, and turns the refusal (which transformers
reports as an unreadable file) into an error that says what is wrong.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prensa.export.source import SourceError


def pretrained_options(model_dir: Path) -> dict[str, Any]:
    """`from_pretrained` keywords: safetensors when present, else pickles restricted to tensors."""
    if any(model_dir.glob("*.safetensors")):
        return {"use_safetensors": True, "trust_remote_code": False}
    return {"use_safetensors": False, "weights_only": True, "trust_remote_code": False}


def _refused_pickle(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, pickle.UnpicklingError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@contextmanager
def refusing_pickled_code(what: str) -> Iterator[None]:
    """Re-raise torch's refusal to unpickle anything but tensors (inside `what`) as a `SourceError`."""
    try:
        yield
    except Exception as exc:
        if _refused_pickle(exc):
            raise SourceError(
                f"{what} is a pickle holding more than tensors; prensa does not unpickle objects that could run "
                "code. Convert the weights to safetensors (or plain tensors) from a trusted copy of the model."
            ) from exc
        raise
