"""The encode stage as Triton's stub runs it on a GPU, in a process that imports no torch (the
stub has none: torch would load CUDA for onnxruntime and hide a missing library). Run as
`python -m tests.gpu.stage_check EXPORT`; prints one JSON line: per batching policy the provider
that ran, and the least per-token cosine of its outputs against the same stage on the CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from prensa.export.agreement import agreement
from prensa.manifest import Manifest
from prensa.stages import contract, load_stage
from prensa.triton.repo import ServingOptions, encode_stage_config
from prensa.workload import embedding_texts

REQUESTS = 48  # ragged requests of 1-3 rows, each padded to its own longest row


def ragged_requests(export: Path, manifest: Manifest) -> list[dict[str, np.ndarray]]:
    tokenizer = Tokenizer.from_file(str(export / manifest.tokenizer_file))
    tokenizer.enable_truncation(manifest.max_length)
    tokenizer.enable_padding()
    texts, requests = iter(embedding_texts(3 * REQUESTS)), []
    for i in range(REQUESTS):
        encodings = tokenizer.encode_batch([next(texts) for _ in range(1 + i % 3)])
        requests.append({
            contract.INPUT_IDS: np.array([e.ids for e in encodings], dtype=np.int64),
            contract.ATTENTION_MASK: np.array([e.attention_mask for e in encodings], dtype=np.int64),
            contract.TOKEN_TYPE_IDS: np.array([e.type_ids for e in encodings], dtype=np.int64),
        })
    return requests


def check(export: Path) -> dict[str, Any]:
    """CUDA (with the CPU's length-ratio rule, with the GPU batching policy, and for an export with a
    packed graph as a CUDA repository serves it) against the CPU."""
    encode, manifest = load_stage("encode"), Manifest.read(export)
    requests = ragged_requests(export, manifest)
    per_token = {o.name for o in manifest.outputs if o.per_token}
    rows = contract.DEFAULT_MAX_BATCH_SIZE
    policies = {
        "cpu": ("cpu", None),
        "cuda": ("cuda", None),
        "cuda gpu-batching": ("cuda", encode.GpuBatching(contract.DEFAULT_GPU_MAX_BATCH_TOKENS, rows,
                                                          contract.gpu_length_buckets(manifest.max_length))),
    }
    outputs, report = {}, {"torch_imported": "torch" in sys.modules, "dtype": manifest.dtype}
    for label, (provider, batching) in policies.items():
        session = encode.create_session(export / manifest.onnx_file, 0, provider)
        encoder = encode.TokenBudgetEncoder(session, manifest.pad_id, max_batch_tokens=contract.DEFAULT_MAX_BATCH_TOKENS,
                                            length_ratio=contract.DEFAULT_LENGTH_RATIO, max_rows=rows,
                                            per_token_outputs=per_token, batching=batching)
        if batching is not None:
            encoder.warm_up(batching.shapes())
        outputs[label] = encoder.encode(requests)
        report[label] = {"provider": session.get_providers()[0]}
    if manifest.packed_file:  # the stage as a CUDA repository configures it (`load_encoder`)
        config = encode_stage_config(export, manifest, ServingOptions(execution_provider="cuda"))
        encoder = encode.load_encoder(config, export)
        outputs["cuda as served"] = encoder.encode(requests)
        report["cuda as served"] = {"provider": encoder.session.get_providers()[0],
                                    "packed": encoder.packed is not None,
                                    "cuda_graphs": len(encoder.graphs.bound) if encoder.graphs else 0,
                                    "real_tokens": encoder.real_tokens, "computed_tokens": encoder.padded_tokens}
    for label in outputs.keys() - {"cpu"}:
        cosines = [cos for got, want, request in zip(outputs[label], outputs["cpu"], requests)
                   for cos, _ in agreement(got, want, request[contract.ATTENTION_MASK], per_token).values()]
        report[label]["min_cosine"] = min(cosines)
    report["torch_imported"] = "torch" in sys.modules
    return report


if __name__ == "__main__":
    print(json.dumps(check(Path(sys.argv[1]))))
