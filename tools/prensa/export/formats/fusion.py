"""onnxruntime's transformer fusions, applied to a traced fp32 graph.

torch's exporter writes attention, residual LayerNorm and the embedding sum as dozens of small ops,
and an onnxruntime session fuses only some of them when it loads the graph. onnxruntime's
transformer optimizer rewrites whole blocks into its fused kernels (Attention,
SkipLayerNormalization, EmbedLayerNormalization, BiasGelu), which makes a lone short query faster
in fp32 and in int8 (quantised from the fused graph) and batches no slower (docs/performance.md,
"Fused ONNX ops"). Those are onnxruntime's own (com.microsoft) ops:
TensorRT cannot parse them, so only graphs that onnxruntime serves are fused, and the caller keeps
a fused graph only if it still agrees with torch.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import onnx


def fuse_transformer_ops(
    model: onnx.ModelProto, target: Path, external: bool = False, weights_dir: Path | None = None
) -> dict[str, int]:
    """Write `model` with BERT-family fusions (BERT, RoBERTa and XLM-R share the patterns) to
    `target`, its weights in `<name>.data` when asked or when they do not fit a protobuf; returns
    the fused ops and their counts, empty (and nothing written) when none matched.

    `model` may leave its weights in external data (`weights_dir` holds the files): the optimizer
    deep-copies the graph for shape inference four times, which costs seconds without the weights
    and minutes and four copies of them with (docs/performance.md). The fusions that read weights
    (Q, K and V merged into one) resolve external data from the working directory, so they run there."""
    from onnx.external_data_helper import load_external_data_for_model
    from onnxruntime.transformers.optimizer import optimize_model

    from prensa.export.formats.graph_store import data_file, needs_external_data

    # opt_level 0: only the graph rewrites, no provider-specific session optimisations baked in.
    with contextlib.chdir(weights_dir or Path.cwd()):
        fusing = optimize_model(model, model_type="bert", num_heads=0, hidden_size=0, opt_level=0)
    # plain LayerNorm is what torch exports already
    fused = {
        op: count
        for op, count in fusing.get_fused_operator_statistics().items()
        if count and op != "LayerNormalization"
    }
    if fused:
        if weights_dir is not None:
            # written out again below, one by one
            load_external_data_for_model(fusing.model, str(weights_dir))
        data_file(target).unlink(missing_ok=True)
        fusing.save_model_to_file(
            str(target), use_external_data_format=external or needs_external_data(fusing.model)
        )
    return fused
