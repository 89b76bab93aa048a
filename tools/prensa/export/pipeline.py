"""`prensa export`: model directory or Hub id -> ONNX graph + tokenizer + manifest, verified.

Two paths end in the same export layout: a torch model is traced (and checked against torch),
a directory that already holds `model.onnx` is adopted as it is (and checked to run and to
produce the outputs its task needs). The steps in `steps` then run on the written graph (int8, the
TensorRT engine, the packed graph), and calibration on the assembled manifest."""

from __future__ import annotations

import dataclasses
import gc
import json
import shutil
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy.typing as npt
import psutil

from prensa.export import llm_reranker
from prensa.export.checks import (
    VERIFY_TEXTS,
    Reference,
    check_adopted,
    check_fp16,
    check_reference,
    compare_with_torch,
    run_onnx,
    run_torch,
    sample_batch,
)
from prensa.export.formats.fp16 import to_fp16
from prensa.export.formats.graph_store import move_graph, remove_staging, rewrite_graph, staging
from prensa.export.formats.onnx_graph import GraphInfo, describe_graph, task_from_outputs
from prensa.export.inspect import (
    ModelPlan,
    plan_model,
    read_own_files,
    require_memory,
    require_native_code,
)
from prensa.export.late import interaction, write_tokenizers
from prensa.export.run import ONNX_FILE, ExportFormat, ExportOptions, ExportRun, Step, VerifyReport
from prensa.export.source import SourceError, SourceModel, resolve_source
from prensa.export.st_layout import lowercase_first, lowercases
from prensa.export.steps import GRAPH_STEPS, calibrate
from prensa.files import GraphDataError, link_graph_files
from prensa.manifest import (
    CALIBRATION_FILE,
    GraphOutput,
    LateInteraction,
    Manifest,
    PairTruncation,
    Task,
)
from prensa.stages import contract

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

# The entry point and what its signature names, for `prensa export` and Python callers.
__all__ = ["ExportFormat", "ExportOptions", "Step", "VerifyReport", "export_model"]

FUSED_FIGURE = "fused ops"  # the report line that says which fusions were kept, or why none
OPSET = 17
TOKEN_INPUTS = (contract.INPUT_IDS, contract.ATTENTION_MASK, contract.TOKEN_TYPE_IDS)
# FlagReranker's default; bge-reranker-v2-m3's tokenizer allows 8192
ST_CONFIG = "config_sentence_transformers.json"  # sentence-transformers' prompts live here
# sentence-transformers' files, copied unchanged: the pooling, length and prompts read from them stay with the graph.
ST_FILES = ("modules.json", "1_Pooling/config.json", "sentence_bert_config.json", ST_CONFIG)


def _no_progress(_: str) -> AbstractContextManager[Any]:
    return nullcontext()


def special_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids never reported as lexical terms (FlagEmbedding drops cls, eos, pad and unk)."""
    names = (
        "cls_token_id",
        "bos_token_id",
        "eos_token_id",
        "sep_token_id",
        "pad_token_id",
        "unk_token_id",
    )
    return sorted({getattr(tokenizer, n) for n in names if getattr(tokenizer, n, None) is not None})


def _check_pair_truncation(source: SourceModel, plan: ModelPlan, rule: PairTruncation) -> None:
    """Only a cross-encoder's or classifier's pairs have two texts to cut by a rule: refuse another
    rule where it would change nothing (an LLM reranker cuts its one filled-in prompt)."""
    if rule is PairTruncation.LONGEST_FIRST:
        return
    if plan.kind.pair_input is None or plan.kind.prompted_pairs:
        kind = "an LLM reranker" if plan.template is not None else f"a {plan.task} model"
        raise SourceError(
            f"{source.name}: --pair-truncation {rule} applies to cross-encoders and classifiers, "
            f"not to {kind}"
        )


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _attention_heads(config: dict[str, Any]) -> int | None:
    """Attention heads of the transformer (a classifier's or a causal LM's config may nest its text model's)."""
    heads = config.get("num_attention_heads") or (config.get("text_config") or {}).get(
        "num_attention_heads"
    )
    return int(heads) if heads else None


def _read_config(source: SourceModel) -> dict[str, Any]:
    return (
        json.loads((source.path / "config.json").read_text()) if source.has("config.json") else {}
    )


def read_prompts(source: SourceModel) -> tuple[dict[str, str], str | None]:
    """sentence-transformers' `prompts` and `default_prompt_name`; a file that sentence-transformers
    itself would refuse is refused here too, before it reaches clients."""
    config = json.loads((source.path / ST_CONFIG).read_text()) if source.has(ST_CONFIG) else {}
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise SourceError(
            f"{source.name}: {ST_CONFIG}'s prompts must map names to texts, got {prompts!r}"
        )
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise SourceError(
            f"{source.name}: {ST_CONFIG}'s default_prompt_name {default!r} is not one of its prompts "
            f"({', '.join(prompts) or 'none'})"
        )
    return prompts, default


def read_matryoshka(source: SourceModel, config: dict[str, Any]) -> list[int] | None:
    """The Matryoshka dimensions the model declares: a `matryoshka_dimensions` list (its config.json
    or sentence-transformers' config), [] for sentence-transformers' `truncate_dim` alone (trained to
    be cut, no list of where), None when it declares neither."""
    st_config = json.loads((source.path / ST_CONFIG).read_text()) if source.has(ST_CONFIG) else {}
    listed = config.get("matryoshka_dimensions") or st_config.get("matryoshka_dimensions")
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(d, int) and d > 0 for d in listed):
            raise SourceError(
                f"{source.name}: matryoshka_dimensions must list positive sizes, got {listed!r}"
            )
        return sorted(set(listed))
    return [] if isinstance(st_config.get("truncate_dim"), int) else None


def _plan(
    source: SourceModel,
    tokenizer: PreTrainedTokenizerBase,
    config: dict[str, Any],
    options: ExportOptions,
    task: Task | None,
    prompts: dict[str, str],
) -> ModelPlan:
    pad_offset = (
        (config.get("pad_token_id") or 0) + 1
        if config.get("model_type") in ("xlm-roberta", "roberta")
        else 0
    )
    positions = config.get("max_position_embeddings")
    plan = plan_model(
        source,
        list(config.get("architectures") or []),
        task,
        options.pooling,
        options.max_length,
        options.dense_only,
        getattr(tokenizer, "model_max_length", None),
        positions - pad_offset if positions else None,
        prompts,
        labels=len(config.get("id2label", {0: 0})),
    )
    default = plan.kind.default_max_length
    if default is not None and options.max_length is None:
        plan = dataclasses.replace(plan, max_length=min(plan.max_length, default))
    if plan.template is not None:
        llm_reranker.require_room(tokenizer, plan.template, plan.max_length, source.name)
    return plan


def _trace(
    graph: nn.Module,
    inputs: list[str],
    outputs: list[GraphOutput],
    sample: dict[str, npt.NDArray[Any]],
    path: Path,
) -> None:
    """torch's trace at `path`; over 2 GB torch writes one weights file per tensor beside it."""
    import torch

    args = tuple(torch.from_numpy(sample[name]) for name in inputs)
    axes = {name: {0: "batch", 1: "tokens"} for name in inputs}
    axes.update(
        {o.name: ({0: "batch", 1: "tokens"} if o.per_token else {0: "batch"}) for o in outputs}
    )
    with torch.no_grad():
        torch.onnx.export(
            graph,
            args,
            str(path),
            input_names=inputs,
            output_names=[o.name for o in outputs],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )


def _trace_into(
    graph: nn.Module,
    inputs: list[str],
    outputs: list[GraphOutput],
    sample: dict[str, npt.NDArray[Any]],
    path: Path,
    external: bool,
) -> None:
    """The trace, written at `path` in the export's layout: torch's per-tensor files (a graph over
    2 GB) are gathered into one data file beside the graph."""
    with staging(path.parent, "trace") as folder:
        traced = Path(folder) / path.name
        _trace(graph, inputs, outputs, sample, traced)
        rewrite_graph(traced, path, external)


def _fuse_checked(
    path: Path,
    inputs: list[str],
    sample: dict[str, npt.NDArray[Any]],
    expected: list[npt.NDArray[Any]],
    plain: VerifyReport,
    external: bool,
) -> tuple[dict[str, int], VerifyReport]:
    """Swap in the fused graph when it agrees with torch within the plain graph's tolerance; the
    report says which graph was kept and why."""
    import onnx

    from prensa.export.formats.fusion import fuse_transformer_ops

    def kept_plain(reason: str) -> tuple[dict[str, int], VerifyReport]:
        return {}, VerifyReport(plain.heading, {**plain.figures, FUSED_FIGURE: reason}, plain.ok)

    with staging(path.parent, "fused") as folder:
        # same name: the graph names its data file after itself
        fused_path = Path(folder) / path.name
        structure = onnx.load(str(path), load_external_data=False)  # fusion rewrites this copy
        fused = fuse_transformer_ops(structure, fused_path, external, weights_dir=path.parent)
        if not fused:
            return kept_plain("none matched; kept as traced")
        checked = compare_with_torch(
            run_onnx(fused_path, inputs, sample), expected, sample[contract.ATTENTION_MASK], "fp32"
        )
        if not checked.ok:
            return kept_plain(
                f"not kept, it disagrees with torch ({'; '.join(checked.figures.values())})"
            )
        move_graph(fused_path, path)
    counts = ", ".join(f"{op} x{count}" for op, count in fused.items())
    return fused, VerifyReport(checked.heading, {**checked.figures, FUSED_FIGURE: counts}, True)


def _load_graph(
    source: SourceModel,
    tokenizer: PreTrainedTokenizerBase,
    plan: ModelPlan,
    sample: dict[str, npt.NDArray[Any]],
) -> tuple[nn.Module, list[GraphOutput], Reference | None]:
    """The torch module to trace, its outputs, and what the model's own library answers for the
    sample (sentence-transformers' `encode`, the LLM reranker card's formula), taken before tracing."""
    if plan.own is not None:
        graph, outputs = plan.own.graph()
        values = plan.own.reference(source, VERIFY_TEXTS)
        return graph, outputs, Reference(plan.own.library, values, "encode")
    if plan.layout is not None:  # sentence-transformers' modules: an embedder's or SPLADE's
        from prensa.export import sentence

        model = sentence.load_sentence_model(source.path, plan.layout, plan.max_length)
        graph, outputs = sentence.sentence_graph(model, plan.layout)
        values = sentence.reference(model, plan.layout, VERIFY_TEXTS, plan.verify_prompt)
        return graph, outputs, Reference(sentence.FIGURE, values, "encode")
    if plan.late is not None:
        from prensa.export.late import late_graph

        graph, outputs = late_graph(source, plan.late)
        return graph, outputs, None
    if plan.template is not None:
        causal, no_id, yes_id = llm_reranker.load(source.path, tokenizer, source.name)
        graph, outputs = llm_reranker.reranker_graph(causal, no_id, yes_id)
        values = llm_reranker.reference(causal, no_id, yes_id, sample)
        return (
            graph,
            outputs,
            Reference(llm_reranker.FIGURE, values, "the card's softmax over no/yes"),
        )
    from prensa.export.graphs import build_graph

    graph, outputs = build_graph(plan.kind, source.path)
    return graph, outputs, None


def _export_torch(
    source: SourceModel,
    tokenizer: PreTrainedTokenizerBase,
    plan: ModelPlan,
    options: ExportOptions,
    dtype: str,
    fuse: bool,
    step: Step,
) -> tuple[GraphInfo, VerifyReport]:
    from prensa.export.graphs import takes_token_types

    with step(f"Loading {plan.task.value} model"):
        sample = sample_batch(
            tokenizer, plan.kind, plan.max_length, plan.template, plan.verify_prompt
        )
        graph, outputs, reference = _load_graph(source, tokenizer, plan, sample)
        inputs = [
            n
            for n in TOKEN_INPUTS
            if n in tokenizer.model_input_names
            and (n != contract.TOKEN_TYPE_IDS or takes_token_types(graph))
        ]
        expected = run_torch(graph, inputs, sample)
    onnx_path = options.out / ONNX_FILE
    with step(f"Tracing to ONNX (opset {OPSET})"):
        try:
            _trace_into(graph, inputs, outputs, sample, onnx_path, options.external_data)
        except RuntimeError as exc:  # torch's tracer and exporter raise plain RuntimeErrors
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SourceError(
                f"{source.name} does not trace to ONNX with torch {_torch_version()}: {first}"
            ) from exc
        del graph  # the torch weights: as large as the graph's, and not needed past the trace
        gc.collect()
    with step("Verifying onnxruntime against torch"):
        report = compare_with_torch(
            run_onnx(onnx_path, inputs, sample), expected, sample[contract.ATTENTION_MASK], "fp32"
        )
    fused: dict[str, int] = {}
    if fuse and report.ok:  # in fp32, before any fp16 conversion: its casts hide the patterns
        with step("Fusing transformer ops for onnxruntime, checking against torch"):
            fused, report = _fuse_checked(
                onnx_path, inputs, sample, expected, report, options.external_data
            )
    if reference is not None and report.ok:
        with step(f"Checking what prensa serves against {reference.described}"):
            report = check_reference(
                run_onnx(onnx_path, inputs, sample), sample, plan, reference, report
            )
    # a trace that disagrees with torch stays fp32; the report says why
    if dtype == "fp32" or not report.ok:
        return GraphInfo(inputs, outputs, "fp32", fused), report
    with step("Converting to fp16 (LayerNorm and softmax kept in fp32)"):
        to_fp16(onnx_path, onnx_path, options.external_data)
    with step("Checking fp16 against fp32 on a sample"):
        checked = check_fp16(onnx_path, inputs, sample, expected, outputs)
    # the fp32 fusion step's figure
    fusion = {k: v for k, v in report.figures.items() if k == FUSED_FIGURE}
    return GraphInfo(inputs, outputs, dtype, fused), VerifyReport(
        checked.heading, {**checked.figures, **fusion}, checked.ok
    )


def _adopt_onnx(
    source: SourceModel,
    tokenizer: PreTrainedTokenizerBase,
    plan: ModelPlan,
    graph: GraphInfo,
    options: ExportOptions,
    step: Step,
) -> tuple[GraphInfo, VerifyReport]:
    with step(f"Adopting {ONNX_FILE} ({graph.dtype}) without re-exporting"):
        try:
            link_graph_files(source.path, options.out, ONNX_FILE)
        except GraphDataError as exc:
            raise SourceError(str(exc)) from exc
    with step("Running the adopted graph on a sample batch"):
        sample = sample_batch(tokenizer, plan.kind, plan.max_length)
        report = check_adopted(
            run_onnx(options.out / ONNX_FILE, graph.inputs, sample),
            graph.outputs,
            sample[contract.INPUT_IDS].shape[0],
        )
    return graph, report


def assemble_manifest(run: ExportRun) -> Manifest:
    """What the export tells Triton's stages and the gateway about the graph it wrote: read from the
    source's configs, the plan, the graph and the engine; `prompts` are the source's, with the
    default one's name (`read_prompts`)."""
    source, config, tokenizer = run.source, run.config, run.tokenizer
    plan, graph, prompts = run.plan, run.graph, run.prompts
    dense_source = contract.SENTENCE_EMBEDDING if plan.graph_pooling else contract.LAST_HIDDEN_STATE
    hidden = next((o.dims[-1] for o in graph.outputs if o.name == dense_source), None)
    labels = {int(k): v for k, v in (config.get("id2label") or {}).items()}
    return Manifest(
        task=plan.task,
        source=source.name,
        revision=source.revision,
        max_length=plan.max_length,
        onnx_file=ONNX_FILE,
        dtype=graph.dtype,
        inputs=graph.inputs,
        outputs=graph.outputs,
        pad_id=int(tokenizer.pad_token_id or 0),
        special_ids=special_ids(tokenizer),
        pooling=plan.pooling,
        graph_pooling=plan.graph_pooling,
        normalize=plan.normalize,
        dim=hidden if plan.kind.dense else None,
        id2label=labels if plan.kind.named_labels else {},
        attention_heads=_attention_heads(config),
        pair_template=plan.template,
        pair_truncation=run.options.pair_truncation,
        packed_file=run.packed_file,
        packed_checked=run.packed_checked,
        tensorrt=run.engine,
        fused_ops=graph.fused_ops,
        prompts=prompts[0],
        default_prompt_name=prompts[1],
        include_prompt=plan.layout.include_prompt if plan.layout else True,
        matryoshka_dimensions=read_matryoshka(source, config) if plan.kind.dense else None,
        late_interaction=run.late_interaction,
        strip_texts=plan.strip_texts,
    )


def _late_interaction(
    source: SourceModel,
    tokenizer: PreTrainedTokenizerBase,
    plan: ModelPlan,
    options: ExportOptions,
    adopted: GraphInfo | None,
) -> LateInteraction | None:
    """A late-interaction model's token ids, or None for other models; what prensa cannot serve as
    PyLate does is refused here, before the export's work."""
    if plan.late is None:
        return None
    refusal = (
        f"{ONNX_FILE} beside it cannot be told which tokens a query expands"
        if adopted
        else "int8 is not checked against PyLate"
        if options.quantize_int8
        else "its TensorRT engine is not built"
        if options.format is ExportFormat.TENSORRT
        else None
    )
    if refusal:
        raise SourceError(
            f"{source.name} is a late-interaction model: {refusal}; export it from its weights to "
            "ONNX fp32 or fp16"
        )
    return interaction(plan.late, tokenizer, source.name)


def export_model(
    options: ExportOptions, step: Step = _no_progress
) -> tuple[Manifest, VerifyReport]:
    from transformers import AutoTokenizer

    if options.format is ExportFormat.TENSORRT:
        from prensa.export.formats.tensorrt import require_tensorrt

        require_tensorrt()  # before minutes of export work
    with step("Locating model files"):
        source = resolve_source(options.source, options.revision)
        config = _read_config(source)
        own = read_own_files(source)
        if own is None:  # read from its own files, it runs no transformers code to check
            require_native_code(source, config)
        if not source.has(ONNX_FILE):  # an adopted graph is not loaded into torch
            require_memory(source, config, psutil.virtual_memory().available)
        # transformers leaves from_pretrained unannotated; there is no typed way to call it.
        tokenizer = (
            own.tokenizer()
            if own is not None
            else AutoTokenizer.from_pretrained(source.path, use_fast=True, trust_remote_code=False)  # type: ignore[no-untyped-call]
        )
        if not tokenizer.is_fast:
            raise SourceError(
                f"{source.name} has no fast (Rust) tokenizer; prensa's tokenize stage needs tokenizer.json"
            )
        if lowercases(source):  # sentence-transformers' `do_lower_case`, kept in the tokenizer file
            lowercase_first(tokenizer)
        prompts = read_prompts(source)
        adopted = describe_graph(source.path / ONNX_FILE) if source.has(ONNX_FILE) else None
        task = options.task or (task_from_outputs(adopted, config) if adopted else None)
        plan = _plan(source, tokenizer, config, options, task, prompts[0])
        _check_pair_truncation(source, plan, options.pair_truncation)
        late_interaction = _late_interaction(source, tokenizer, plan, options, adopted)
    options.out.mkdir(parents=True, exist_ok=True)
    remove_staging(options.out)  # what an export killed midway left: gigabytes for a large model
    if adopted:
        adopted.require(plan.task)
        if plan.layout is not None and not plan.layout.include_prompt:
            raise SourceError(
                f"{source.name}: its pooling leaves prompt tokens out (include_prompt: false), which "
                f"{ONNX_FILE} cannot be told; export it from its weights instead of adopting the graph"
            )
        if plan.graph_pooling:
            raise SourceError(
                f"{source.name}: model.onnx outputs hidden states, and its sentence-transformers modules "
                f"({plan.graph_pooling} pooling, {len(plan.layout.dense) if plan.layout else 0} Dense) "
                "would be skipped; export it from its weights instead of adopting the graph"
            )
        graph, report = _adopt_onnx(source, tokenizer, plan, adopted, options, step)
    else:
        onnx_dtype = options.served_dtype if options.format is ExportFormat.ONNX else "fp32"
        fuse = options.fuse_ops and options.format is ExportFormat.ONNX
        graph, report = _export_torch(source, tokenizer, plan, options, onnx_dtype, fuse, step)
    run = ExportRun(
        source, config, tokenizer, plan, options, step, prompts, late_interaction, graph, report
    )
    for graph_step in GRAPH_STEPS:
        if graph_step.applies(run):
            graph_step.apply(run)
    with step("Writing tokenizer and sentence-transformers configs"):
        tokenizer.save_pretrained(options.out)
        for extra in ST_FILES:
            if source.has(extra):
                (options.out / extra).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source.path / extra, options.out / extra)
    manifest = assemble_manifest(run)
    if late_interaction is not None:
        with step("Framing queries and documents with the model's marker tokens"):
            write_tokenizers(options.out, manifest.tokenizer_file, late_interaction, source.name)
    # a previous export's, into the same directory
    (options.out / CALIBRATION_FILE).unlink(missing_ok=True)
    if calibrate.applies(manifest):
        calibrate.apply(run, manifest)
    with step("Writing manifest"):
        manifest.write(options.out)
    return manifest, run.report
