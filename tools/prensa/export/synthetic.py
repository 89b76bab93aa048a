"""bge-m3, bge-reranker-v2-m3, Qwen3-Embedding, a PyLate ColBERT and a static embedding model with
random weights, at their real size or a tiny one.

A GPU benchmark needs the real shapes, not the real weights: a forward pass costs the same
whatever the weights hold. `full` is XLM-RoBERTa large as both BAAI models ship it (bge-m3:
an encoder without pooler plus `sparse_linear.pt` and `colbert_linear.pt`; the reranker: a
one-label sequence classifier); `tiny` has the same layout at a size CPU tests build in seconds.
The tokenizer is a small unigram model with XLM-R's special tokens and ids, trained on the spot
(nothing is downloaded); token ids stay below its vocabulary, which the full model's 250,002-row
embedding covers. torch and transformers (the `export` extra) are imported inside functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prensa.export import late

Size = Literal["tiny", "full"]


@dataclass(frozen=True)
class XlmrShape:
    """The dimensions that set a forward pass's cost; `vocab_size` None: the tokenizer's size."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab_size: int | None
    max_positions: int


SHAPES: dict[str, XlmrShape] = {
    "tiny": XlmrShape(layers=2, hidden=32, heads=4, ffn=64, vocab_size=None, max_positions=514),
    "full": XlmrShape(
        layers=24, hidden=1024, heads=16, ffn=4096, vocab_size=250002, max_positions=8194
    ),
}
# What the tokenizers of both BAAI models declare (8192 tokens plus XLM-R's two offset positions).
MAX_LENGTH: dict[str, int] = {"tiny": 512, "full": 8192}
XLMR_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0-4, as in XLM-R's vocabulary
TOKENIZER_VOCAB = 400
TOKENIZER_CORPUS = [
    "Berlin is the capital and largest city of Germany.",
    "Dense retrieval encodes queries and passages into vectors.",
    "Sparse retrieval weights individual terms of a document.",
    "Late interaction keeps one vector per token and scores with max similarity.",
    "Rerankers score a query together with each candidate passage.",
    "Triton Inference Server batches requests dynamically on CPUs and GPUs.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Émilie a mangé une pomme à Montréal; 東京は日本の首都です。",
] * 25
BGE_M3_HEADS = ("sparse_linear.pt", "colbert_linear.pt")


def shape(size: Size) -> XlmrShape:
    if size not in SHAPES:
        raise ValueError(f"unknown size {size!r}: one of {', '.join(SHAPES)}")
    return SHAPES[size]


def xlmr_tokenizer(directory: Path, max_length: int) -> Any:
    """A fast XLM-R tokenizer (unigram, Metaspace, `<s> A </s></s> B </s>`) saved in `directory`."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import XLMRobertaTokenizerFast

    model = Tokenizer(models.Unigram())
    model.normalizer = normalizers.NFKC()
    model.pre_tokenizer = pre_tokenizers.Metaspace()
    model.decoder = decoders.Metaspace()
    model.train_from_iterator(
        TOKENIZER_CORPUS,
        trainers.UnigramTrainer(
            vocab_size=TOKENIZER_VOCAB, special_tokens=XLMR_SPECIALS, unk_token="<unk>"
        ),
    )
    model.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tokenizer = XLMRobertaTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=model,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        model_max_length=max_length,
    )
    tokenizer.save_pretrained(directory)
    return tokenizer


def xlmr_config(size: Size, vocab_size: int | None = None, **extra: Any) -> Any:
    """The XLMRobertaConfig of `size`; `vocab_size` is used only where the size leaves it open."""
    from transformers import XLMRobertaConfig

    dims = shape(size)
    vocab = dims.vocab_size or vocab_size
    if vocab is None:
        raise ValueError(f"size {size!r} takes its vocabulary from the tokenizer: pass vocab_size")
    return XLMRobertaConfig(  # type: ignore[no-untyped-call]
        vocab_size=vocab,
        hidden_size=dims.hidden,
        num_hidden_layers=dims.layers,
        num_attention_heads=dims.heads,
        intermediate_size=dims.ffn,
        max_position_embeddings=dims.max_positions,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        layer_norm_eps=1e-5,
        **extra,
    )


def bge_m3_config(size: Size, vocab_size: int | None = None) -> Any:
    return xlmr_config(size, vocab_size, architectures=["XLMRobertaModel"])


def reranker_config(size: Size, vocab_size: int | None = None) -> Any:
    return xlmr_config(
        size,
        vocab_size,
        architectures=["XLMRobertaForSequenceClassification"],
        num_labels=1,
        id2label={0: "LABEL_0"},
        label2id={"LABEL_0": 0},
    )


def _heads(hidden: int) -> dict[str, Any]:
    """bge-m3's two heads; the sparse bias is positive so a random model still yields sparse terms."""
    import torch

    sparse = torch.nn.Linear(hidden, 1)
    torch.nn.init.constant_(sparse.bias, 0.5)
    return {"sparse_linear.pt": sparse, "colbert_linear.pt": torch.nn.Linear(hidden, hidden)}


def bge_m3(directory: Path, size: Size = "tiny", seed: int = 0) -> Path:
    """XLMRobertaModel (no pooler, safetensors) + sparse_linear.pt + colbert_linear.pt + tokenizer."""
    import torch
    from transformers import XLMRobertaModel

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = xlmr_tokenizer(directory, MAX_LENGTH[size])
    torch.manual_seed(seed)
    config = bge_m3_config(size, len(tokenizer))
    XLMRobertaModel(config, add_pooling_layer=False).save_pretrained(directory)  # type: ignore[no-untyped-call]
    for name, head in _heads(config.hidden_size).items():
        torch.save(head.state_dict(), directory / name)
    return directory


def bge_reranker(directory: Path, size: Size = "tiny", seed: int = 1) -> Path:
    """XLMRobertaForSequenceClassification with one label (bge-reranker-v2-m3's layout) + tokenizer.
    The output projection is scaled up so random logits spread and orderings are not ties."""
    import torch
    from transformers import XLMRobertaForSequenceClassification

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = xlmr_tokenizer(directory, MAX_LENGTH[size])
    torch.manual_seed(seed)
    model = XLMRobertaForSequenceClassification(reranker_config(size, len(tokenizer)))  # type: ignore[no-untyped-call]
    with torch.no_grad():
        model.classifier.out_proj.weight.mul_(20.0)
    model.save_pretrained(directory)
    return directory


# Qwen3-Embedding-0.6B's shape (its config.json): 28 layers, hidden 1024, 16 query and 8 key/value
# heads of 128, FFN 3072, 151,669 tokens, tied embeddings; 596M parameters, 2.4 GB in fp32.
QWEN3_EMBEDDING: dict[str, dict[str, Any]] = {
    "tiny": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": None,
        "max_position_embeddings": 512,
    },
    "full": {
        "num_hidden_layers": 28,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151669,
        "max_position_embeddings": 32768,
    },
}
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN3_QUERY_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)


def qwen_tokenizer(directory: Path, max_length: int) -> Any:
    """A byte-level BPE tokenizer with Qwen's specials that appends `<|endoftext|>` to every text
    and pads on the left, as Qwen3-Embedding's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import Qwen2TokenizerFast

    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    model.train_from_iterator(
        TOKENIZER_CORPUS,
        trainers.BpeTrainer(
            vocab_size=TOKENIZER_VOCAB * 2,
            special_tokens=QWEN_SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    model.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>",
        pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
        special_tokens=[("<|endoftext|>", model.token_to_id("<|endoftext|>"))],
    )
    tokenizer = Qwen2TokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=model,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        padding_side="left",
        model_max_length=max_length,
    )
    tokenizer.save_pretrained(directory)
    return tokenizer


def qwen3_embedding(directory: Path, size: Size = "tiny", seed: int = 2) -> Path:
    """Qwen3-Embedding's layout at `size`: Qwen3Model, last-token pooling, Normalize, its query
    instruction as the `query` prompt, saved by sentence-transformers."""
    import shutil

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.normalize import Normalize
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    from transformers import Qwen3Config, Qwen3Model

    dims = QWEN3_EMBEDDING[size]
    base = directory.parent / f"{directory.name}-transformer"
    tokenizer = qwen_tokenizer(base, MAX_LENGTH[size])
    config = Qwen3Config(
        **{**dims, "vocab_size": dims["vocab_size"] or len(tokenizer)},  # type: ignore[no-untyped-call]
        tie_word_embeddings=True,
        rope_theta=1_000_000,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    Qwen3Model(config).save_pretrained(base)
    modules = [
        Transformer(str(base)),
        Pooling(dims["hidden_size"], pooling_mode="lasttoken"),
        Normalize(),
    ]
    SentenceTransformer(
        modules=modules, prompts={"query": QWEN3_QUERY_PROMPT, "document": ""}
    ).save(str(directory))
    shutil.rmtree(base)
    return directory


def parameter_count(config: Any, kind: Literal["bge-m3", "reranker"]) -> int:
    """Parameters of the model `config` describes, counted on torch's meta device: no weights are
    allocated, so the full size costs no memory. bge-m3 includes its two head files."""
    import torch
    from transformers import XLMRobertaForSequenceClassification, XLMRobertaModel

    with torch.device("meta"):
        model = (
            XLMRobertaModel(config, add_pooling_layer=False)  # type: ignore[no-untyped-call]
            if kind == "bge-m3"
            else XLMRobertaForSequenceClassification(config)  # type: ignore[no-untyped-call]
        )
        heads = list(_heads(config.hidden_size).values()) if kind == "bge-m3" else []
    return sum(p.numel() for module in (model, *heads) for p in module.parameters())


def flops_per_token(config: Any, length: int) -> float:
    """Forward FLOPs per token of an XLM-R encoder at `length` tokens per row: two per weight of
    the layers' matrices (embeddings are lookups), plus QK^T and attention x V (4 x length x hidden
    per layer). XLM-R large: 0.62 GFLOP at 128 tokens, 0.65 at 512."""
    hidden, layers, ffn = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    per_layer = 4 * hidden * hidden + 2 * hidden * ffn
    return float(layers * (2 * per_layer + 4 * length * hidden))


# answerai-colbert-small-v1's shape (its config.json and 1_Dense): a 12-layer BERT of width 384
# (12 heads, FFN 1536, 30,522 tokens, 512 positions) projected to 96 dimensions; 33M parameters.
COLBERT: dict[str, dict[str, int]] = {
    "tiny": {"layers": 2, "hidden": 32, "heads": 4, "ffn": 64, "vocab": 0, "dim": 16},
    "full": {"layers": 12, "hidden": 384, "heads": 12, "ffn": 1536, "vocab": 30522, "dim": 96},
}
# PyLate's defaults, which answerai-colbert-small-v1 keeps: queries expanded to 32 tokens,
# documents cut at 180, punctuation skipped
COLBERT_SETTINGS: dict[str, Any] = {
    "query_prefix": late.PYLATE_QUERY_PREFIX,
    "document_prefix": late.PYLATE_DOCUMENT_PREFIX,
    "query_length": late.DEFAULT_QUERY_LENGTH,
    "document_length": late.DEFAULT_DOCUMENT_LENGTH,
    "do_query_expansion": True,
    "attend_to_expansion_tokens": False,
    "similarity_fn_name": "MaxSim",
}
WORDPIECE_VOCAB = 2000


def bert_tokenizer(directory: Path, markers: tuple[str, ...] = ()) -> Any:
    """A fast WordPiece tokenizer (`[CLS] A [SEP]`, lower-cased) learnt from the benchmark's
    passages, `markers` added as PyLate adds its prefixes, saved in `directory`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers as learners
    from transformers import PreTrainedTokenizerFast

    from prensa.workload import passages

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    model = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    model.normalizer = normalizers.BertNormalizer(lowercase=True)
    model.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    model.decoder = decoders.WordPiece()
    model.train_from_iterator(
        passages(), learners.WordPieceTrainer(vocab_size=WORDPIECE_VOCAB, special_tokens=specials)
    )
    model.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[
            ("[CLS]", model.token_to_id("[CLS]")),
            ("[SEP]", model.token_to_id("[SEP]")),
        ],
    )
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=model,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )
    tokenizer.add_tokens(list(markers))
    tokenizer.save_pretrained(directory)
    return tokenizer


def colbert(directory: Path, size: Size = "tiny", seed: int = 3) -> Path:
    """A PyLate late-interaction model with random weights, saved as PyLate saves one: a BERT
    (answerai-colbert-small-v1's shape at `full`), `1_Dense` projecting each token without bias,
    `modules.json`, and PyLate's settings with their markers in the tokenizer."""
    import json
    import string

    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    dims = COLBERT[size]
    directory.mkdir(parents=True, exist_ok=True)
    prefixes = (COLBERT_SETTINGS["query_prefix"], COLBERT_SETTINGS["document_prefix"])
    tokenizer = bert_tokenizer(directory, prefixes)
    torch.manual_seed(seed)
    config = BertConfig(  # type: ignore[no-untyped-call]
        vocab_size=max(dims["vocab"], len(tokenizer)),
        hidden_size=dims["hidden"],
        num_hidden_layers=dims["layers"],
        num_attention_heads=dims["heads"],
        intermediate_size=dims["ffn"],
        max_position_embeddings=512,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(directory)  # type: ignore[no-untyped-call]
    dense = directory / "1_Dense"
    dense.mkdir(exist_ok=True)
    projection = torch.randn(dims["dim"], dims["hidden"]) / dims["hidden"] ** 0.5
    save_file({"linear.weight": projection}, str(dense / "model.safetensors"))
    (dense / "config.json").write_text(
        json.dumps(
            {
                "in_features": dims["hidden"],
                "out_features": dims["dim"],
                "bias": False,
                "activation_function": "torch.nn.modules.linear.Identity",
                "use_residual": False,
            }
        )
    )
    (directory / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
            ]
        )
    )
    length = COLBERT_SETTINGS["document_length"]
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": length - 1, "do_lower_case": False})
    )
    (directory / "config_sentence_transformers.json").write_text(
        json.dumps({**COLBERT_SETTINGS, "skiplist_words": list(string.punctuation)})
    )
    return directory


# static-retrieval-mrl-en-v1's table: bert-base-uncased's vocabulary (the tokenizer given) x 1024
STATIC_DIMS: dict[str, int] = {"tiny": 16, "full": 1024}


def static_embedding(
    directory: Path, tokenizer_file: Path, size: Size = "tiny", seed: int = 5
) -> Path:
    """sentence-transformers' `StaticEmbedding` on `tokenizer_file` (its vocabulary sets the table's
    rows; static-retrieval-mrl-en-v1 reads bert-base-uncased's), saved as sentence-transformers 5
    saves it: `tokenizer.json` and `model.safetensors` at the root, no `config.json`."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules.static_embedding import StaticEmbedding
    from tokenizers import Tokenizer

    torch.manual_seed(seed)
    table = StaticEmbedding(
        Tokenizer.from_file(str(tokenizer_file)), embedding_dim=STATIC_DIMS[size]
    )
    SentenceTransformer(modules=[table]).save(str(directory))
    return directory
