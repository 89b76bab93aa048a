"""The packed graph: the same encoder computing over real tokens only, for onnxruntime's CUDA provider.

A padded batch costs a GPU the padding: one long row pads a whole pass. onnxruntime's packing mode
rewrites a fused BERT-family graph (its `Attention` nodes) so that the padding is removed after the
embeddings (`RemovePadding`), attention runs over the packed tokens (`PackedAttention`, each row
attending within its own span) and the padding is put back after the last LayerNorm
(`RestorePadding`). The graph's inputs and outputs stay as they were: the encode stage feeds it
the same padded tensors, and what it pays follows the real tokens.

Those three ops have CUDA kernels only, so the packed graph is written beside `model.onnx` at export
and checked where it runs: the encode stage on CUDA compares it with the unpacked graph when it
loads, and serves the unpacked one, saying why, if they disagree. Both graphs read the same weights: an
export with a packed graph keeps them in `model.onnx.data` beside the graphs, whatever their size.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prensa.export.formats.onnx_graph import GraphInfo

if TYPE_CHECKING:  # onnx is the export extra's: `import prensa.cli` must not load it
    import onnx

PACKED_FILE = "model.packed.onnx"
PACKED_OPS = ("RemovePadding", "RestorePadding")
ATTENTION_OPS = ("Attention", "MultiHeadAttention")
# what the graph computes attention with once packed, by the op it replaced
PACKED_ATTENTION = {
    "Attention": "PackedAttention",
    "MultiHeadAttention": "PackedMultiHeadAttention",
}


def packing_refusal(model: onnx.ModelProto) -> str | None:
    """Why onnxruntime's packing mode cannot rewrite `model`, or None when it can try."""
    ops = {node.op_type for node in model.graph.node}
    present = [op for op in ATTENTION_OPS if op in ops]
    if not present:
        return "no fused Attention op in the graph (packing rewrites onnxruntime's fused attention)"
    if len(present) > 1:
        return "the graph mixes Attention and MultiHeadAttention, which packing mode does not take"
    return None


def write_packed_graph(graph: Path, target: Path) -> str | None:
    """Write the packed form of `graph` to `target` (see the module docstring), moving `graph`'s
    weights into its data file first if they are inside it; returns why it could not be packed
    (nothing written) or None."""
    import onnx
    from onnxruntime.transformers.convert_to_packing_mode import PackingMode
    from onnxruntime.transformers.onnx_model import OnnxModel

    from prensa.export.formats.graph_store import rewrite_graph
    from prensa.files import graph_data_files

    model = onnx.load(str(graph), load_external_data=False)
    if refusal := packing_refusal(model):
        return refusal
    if not graph_data_files(graph):  # one weights file for both graphs, not a copy in each
        rewrite_graph(graph, graph, external=True)
        model = onnx.load(str(graph), load_external_data=False)
    attention = next(op for op in ATTENTION_OPS if any(n.op_type == op for n in model.graph.node))
    packing = PackingMode(OnnxModel(model))
    # no shape inference: it would need the weights, which stay where they are
    packing.convert(use_symbolic_shape_infer=False)
    packed = packing.model.model
    ops = {node.op_type for node in packed.graph.node}
    missing = [op for op in (*PACKED_OPS, PACKED_ATTENTION[attention]) if op not in ops]
    if missing or attention in ops:
        # packing mode gives up without saying why: no mask on the attention, no final LayerNorm
        return (
            f"onnxruntime's packing mode left the graph unpacked (no {', '.join(missing)}): its "
            "attention takes no padding mask, or no LayerNorm ends the encoder"
        )
    onnx.save_model(packed, str(target))
    return None


def cuda_available() -> bool:
    """Whether onnxruntime's CUDA provider is there to run a packed graph."""
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def check_on_cuda(graph: Path, packed: Path, info: GraphInfo, pad_id: int) -> str | None:
    """Why `packed` may not serve in place of `graph` on this machine's GPU (the encode stage's own
    check, `packed_refusal`), or None."""
    from prensa.stages import load_stage

    encode = load_stage("encode")
    session = encode.create_session(graph, 0, "cuda")
    loaded = encode.create_session(packed, 0, "cuda")
    if loaded.get_providers()[0] != "CUDAExecutionProvider":
        return f"it runs on {loaded.get_providers()[0]}"
    per_token = {o.name for o in info.outputs if o.per_token}
    refusal: str | None = encode.packed_refusal(session, loaded, pad_id, 64, per_token)
    return refusal
