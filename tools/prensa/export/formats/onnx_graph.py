"""Read an existing ONNX graph's interface (inputs, outputs, precision) to adopt it as an export."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prensa.export.source import SourceError
from prensa.layouts import CLASSIFIER, CROSS_ENCODER, EMBEDDER, M3, SPLADE, resolve
from prensa.manifest import GraphOutput, Task
from prensa.stages import contract

if TYPE_CHECKING:
    import onnx

QUANTIZED_OPS = {
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "QLinearMatMul",
    "QuantizeLinear",
    "ConvInteger",
}
TOKEN_INPUTS = {contract.INPUT_IDS, contract.ATTENTION_MASK, contract.TOKEN_TYPE_IDS}


@dataclass(frozen=True)
class GraphInfo:
    inputs: list[str]
    outputs: list[GraphOutput]
    dtype: str
    # onnxruntime-only kernels (export/formats/fusion.py)
    fused_ops: dict[str, int] = field(default_factory=dict)

    def require(self, task: Task) -> None:
        names = {o.name for o in self.outputs}
        missing = resolve(task).graph_outputs - names
        if missing:
            raise SourceError(
                f"model.onnx has outputs {sorted(names)}; a {task.value} model needs {sorted(missing)}"
            )


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
        for d in value_info.type.tensor_type.shape.dim
    ]


def describe_graph(path: Path) -> GraphInfo:
    """Inputs, outputs and precision of an ONNX file, without loading its weights."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    unknown = set(inputs) - TOKEN_INPUTS
    if unknown or contract.INPUT_IDS not in inputs:
        raise SourceError(f"model.onnx takes inputs {inputs}; prensa feeds {sorted(TOKEN_INPUTS)}")
    outputs = []
    for value in model.graph.output:
        dims = _dims(value)[1:]  # drop the batch axis
        per_token = len(dims) >= 1 and not isinstance(dims[0], int)
        outputs.append(
            GraphOutput(value.name, [-1 if not isinstance(d, int) else d for d in dims], per_token)
        )
    ops = {node.op_type for node in model.graph.node}
    fp16 = any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer)
    dtype = "int8" if ops & QUANTIZED_OPS else "fp16" if fp16 else "fp32"
    return GraphInfo(inputs, outputs, dtype)


def task_from_outputs(graph: GraphInfo, config: dict[str, Any]) -> Task:
    """An adopted graph's task, from the outputs each layout's pool stage reads; one logit (and at
    most one label in config.json) is a cross-encoder's, more a classifier's."""
    names = {o.name: o for o in graph.outputs}
    if M3.graph_outputs <= names.keys():
        return M3.task
    if contract.LOGITS in names:
        labels = names[contract.LOGITS].dims[-1] if names[contract.LOGITS].dims else 1
        one = labels == 1 and len(config.get("id2label", {0: 0})) == 1
        return CROSS_ENCODER.task if one else CLASSIFIER.task
    if SPLADE.graph_outputs <= names.keys():
        return SPLADE.task
    return EMBEDDER.task
