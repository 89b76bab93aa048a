"""Tiny random models of the layouts teams deploy now, saved as their real repositories are:
sentence-transformers 5 directories (and the legacy 2.x-4.x form), Dense layers, decoder
embedders (Qwen3-Embedding, gte-Qwen2, e5-mistral, Llama), EmbeddingGemma, ModernBERT, SPLADE
saved by `SparseEncoder`, and Qwen3-Reranker. Tokenizers are built on the spot from a small
corpus, the same on every run: nothing is downloaded. Each builder returns the directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from tests.tiny_models import corpus_words, unigram_model

CORPUS = [
    "Berlin is the capital and largest city of Germany.",
    "Paris is the capital of France and home of the Louvre museum.",
    "Dense retrieval encodes queries and passages into vectors.",
    "Given a web search query, retrieve relevant passages that answer the query",
    "Instruct: Query: Document: task: search result | query: title: none | text:",
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided.",
    "Note that the answer can only be yes or no. system user assistant think",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Émilie a mangé une pomme à Montréal; 東京は日本の首都です。",
] * 20
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
QWEN3_EMBEDDING_PROMPTS = {"query": "Instruct: Given a web search query, retrieve relevant passages that answer "
                                    "the query\nQuery:", "document": ""}
GEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: ",
                 "Classification": "task: classification | query: "}
DECODERS = ("qwen3", "qwen2", "mistral", "llama")
# Whitespace around, inside and instead of a text: a byte-level tokenizer keeps it as tokens, so a
# server that reads texts otherwise than the reference library (stripped or not) answers otherwise.
# Every tier that compares a layout with its reference sends these.
WHITESPACE_TEXTS = ["  Berlin is the capital of Germany.  ", "\tParis is the capital of France.\n", " \t\n ",
                    "Berlin   is the\t\tcapital  of\n\nGermany.", "\n\nthe quick brown fox "]


def qwen_tokenizer(directory: Path, append_eos: bool, padding_side: str = "left"):
    """A byte-level BPE tokenizer with Qwen's special tokens; Qwen3-Embedding's appends
    `<|endoftext|>` to every text (its post-processor), and pads on the left."""
    from transformers import Qwen2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=600, special_tokens=QWEN_SPECIALS,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if append_eos:
        eos = tok.token_to_id("<|endoftext|>")
        tok.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
                                                           special_tokens=[("<|endoftext|>", eos)])
    fast = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                              unk_token=None, bos_token=None, padding_side=padding_side, model_max_length=512)
    fast.save_pretrained(directory)
    return fast


def wordpiece_tokenizer(directory: Path, input_names: tuple[str, ...] = ("input_ids", "attention_mask"),
                        reserved: tuple[str, ...] = ()):
    """A BERT-style tokenizer ([CLS] text [SEP]), for ModernBERT and BERT layouts; `reserved` pieces
    (BERT's `[unused0]`...) follow the special tokens in the vocabulary."""
    words = corpus_words(CORPUS, normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer())
    chars = sorted({c for word in words for c in word})
    pieces = dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *reserved, *chars, *(f"##{c}" for c in chars),
                            *words])
    tok = Tokenizer(models.WordPiece({piece: i for i, piece in enumerate(pieces)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return _saved_bert_style(tok, directory, "[CLS] $A [SEP] $B:1 [SEP]:1", input_names)


def _saved_bert_style(tok: Tokenizer, directory: Path, pair: str, input_names: tuple[str, ...]):
    """`tok` framed as BERT frames a text ([CLS] $A [SEP], pairs by `pair`), saved as a fast tokenizer
    with BERT's special tokens."""
    from transformers import PreTrainedTokenizerFast

    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair=pair,
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=512,
                                   model_input_names=list(input_names))
    fast.save_pretrained(directory)
    return fast


def byte_level_tokenizer(directory: Path):
    """ModernBERT's kind of tokenizer ([CLS] text [SEP] around a byte-level BPE): whitespace is
    kept as tokens (`Ġ`, `Ċ`, `ĉ`), unlike WordPiece's. The merges spell each corpus word left to
    right, the most frequent words first: the same vocabulary on every run."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words = corpus_words(CORPUS, normalizers.NFC(), byte_level)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {piece: i for i, piece in enumerate(dict.fromkeys([*specials, *sorted(byte_level.alphabet())]))}
    merges = []
    for word in words:
        for end in range(2, len(word) + 1):
            left, right = word[: end - 1], word[end - 1]
            if word[:end] not in vocab:
                vocab[word[:end]] = len(vocab)
                merges.append((left, right))
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    return _saved_bert_style(tok, directory, "[CLS] $A [SEP] $B [SEP]", ("input_ids", "attention_mask"))


def gemma_tokenizer(directory: Path):
    """A unigram tokenizer with Gemma's specials: `<bos>` before and `<eos>` after each text."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(unigram_model(CORPUS, ["<pad>", "<eos>", "<bos>", "<unk>"], "<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A <eos>", pair="<bos> $A <eos> $B <eos>",
                                                       special_tokens=[("<bos>", 2), ("<eos>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", model_max_length=512, model_input_names=["input_ids", "attention_mask"])
    fast.save_pretrained(directory)
    return fast


def _random(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Spread the weights a little past their initialisation, so layouts that differ give vectors that differ."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    return model.eval()


def decoder_config(kind: str, vocab: int, **extra):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, **extra)
    return {"qwen3": lambda: Qwen3Config(**common, head_dim=16),
            "qwen2": lambda: Qwen2Config(**common),
            "mistral": lambda: MistralConfig(**common, sliding_window=6),  # short: the window shows in tests
            "llama": lambda: LlamaConfig(**common)}[kind]()


def _sentence_transformer(directory: Path, base: Path, after: list, prompts: dict[str, str] | None = None) -> Path:
    """`SentenceTransformer(modules=[Transformer(base), *after]).save(directory)`: sentence-transformers 5's form."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.transformer import Transformer

    shutil.rmtree(directory, ignore_errors=True)
    model = SentenceTransformer(modules=[Transformer(str(base)), *after], prompts=prompts or {})
    model.save(str(directory))
    shutil.rmtree(base)
    return directory


def _pooling(dim: int, mode: str | list[str], include_prompt: bool = True):
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    return Pooling(dim, pooling_mode=mode, include_prompt=include_prompt)


def _normalize():
    from sentence_transformers.sentence_transformer.modules.normalize import Normalize

    return Normalize()


def _dense(inputs: int, outputs: int, bias: bool, activation: torch.nn.Module, seed: int):
    from sentence_transformers.base.modules.dense import Dense

    torch.manual_seed(seed)
    return Dense(inputs, outputs, bias=bias, activation_function=activation)


def decoder_embedder(directory: Path, kind: str = "qwen3", seed: int = 3) -> Path:
    """Qwen3-Embedding's layout (or gte-Qwen2's, e5-mistral's, a Llama's): the bare decoder, last-token
    pooling, Normalize, left padding, EOS appended, an instruction prompt for queries."""
    from transformers import AutoModel

    base = directory.parent / f"{directory.name}-base"
    tokenizer = qwen_tokenizer(base, append_eos=True)
    config = decoder_config(kind, len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    _random(AutoModel.from_config(config), seed).save_pretrained(base)
    return _sentence_transformer(directory, base, [_pooling(64, "lasttoken"), _normalize()], QWEN3_EMBEDDING_PROMPTS)


def embedding_gemma(directory: Path, seed: int = 4) -> Path:
    """EmbeddingGemma's layout: Gemma3TextModel with bidirectional attention (a sliding layer and a
    full one), mean pooling, Dense 64 -> 256 -> 64 without bias or activation, Normalize, named prompts."""
    from transformers import Gemma3TextConfig, Gemma3TextModel

    base = directory.parent / f"{directory.name}-base"
    tokenizer = gemma_tokenizer(base)
    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                              max_position_embeddings=512, sliding_window=8, use_bidirectional_attention=True,
                              layer_types=["sliding_attention", "full_attention"], pad_token_id=0, eos_token_id=1,
                              bos_token_id=2)
    torch.manual_seed(seed)
    _random(Gemma3TextModel(config), seed).save_pretrained(base)
    identity = torch.nn.Identity()
    after = [_pooling(64, "mean"), _dense(64, 256, False, identity, seed), _dense(256, 64, False, identity, seed + 1),
             _normalize()]
    return _sentence_transformer(directory, base, after, GEMMA_PROMPTS)


def modernbert(directory: Path, pooling: str = "cls", seed: int = 5) -> Path:
    """gte-modernbert's layout (cls pooling) or modernbert-embed's (mean), on its byte-level tokenizer."""
    base = modernbert_base(directory.parent / f"{directory.name}-base", seed)
    return _sentence_transformer(directory, base, [_pooling(64, pooling), _normalize()])


def lowercasing(directory: Path, lowercase: bool = True) -> Path:
    """`modernbert`'s mean-pooled layout with `do_lower_case` in its Transformer's config, as older
    sentence-transformers saved such a model: the flag in the config, its cased byte-level tokenizer
    file as it was. sentence-transformers lowercases every text before that tokenizer reads it."""
    modernbert(directory, "mean")
    path = directory / "sentence_bert_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "do_lower_case": lowercase}))
    return directory


def modernbert_base(base: Path, seed: int, masked_lm: bool = False) -> Path:
    """A ModernBERT transformer with a byte-level tokenizer, saved as transformers saves one."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM, ModernBertModel

    tokenizer = byte_level_tokenizer(base)
    config = ModernBertConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, local_attention=8, global_attn_every_n_layers=2,
                              max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
                              cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id)
    torch.manual_seed(seed)
    _random(ModernBertForMaskedLM(config) if masked_lm else ModernBertModel(config), seed).save_pretrained(base)
    return base


def bert_base(base: Path, seed: int, masked_lm: bool = False) -> Path:
    from transformers import BertConfig, BertForMaskedLM, BertModel

    tokenizer = wordpiece_tokenizer(base, ("input_ids", "token_type_ids", "attention_mask"))
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=512, type_vocab_size=1)
    torch.manual_seed(seed)
    model = BertForMaskedLM(config) if masked_lm else BertModel(config, add_pooling_layer=False)
    _random(model, seed).save_pretrained(base)
    return base


def stanford_colbert(directory: Path, seed: int = 12, dim: int = 16, query_length: int = 12,
                     document_length: int = 24, attend_to_mask_tokens: bool = True) -> Path:
    """colbert-ai's `HF_ColBERT` checkpoint: a BERT's weights under `bert.`, `linear.weight` (no bias)
    projecting each token, `artifact.metadata` with its lengths and markers ([unused0], [unused1],
    in the vocabulary as in BERT's)."""
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    tokenizer = wordpiece_tokenizer(directory, ("input_ids", "token_type_ids", "attention_mask"),
                                    reserved=("[unused0]", "[unused1]"))
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=512, type_vocab_size=1,
                        architectures=["HF_ColBERT"])
    torch.manual_seed(seed)
    bert = _random(BertModel(config, add_pooling_layer=False), seed)
    weights = {f"bert.{name}": tensor.contiguous() for name, tensor in bert.state_dict().items()}
    weights["linear.weight"] = torch.randn(dim, 32, generator=torch.Generator().manual_seed(seed))
    save_file(weights, str(directory / "model.safetensors"))
    config.save_pretrained(directory)
    (directory / "artifact.metadata").write_text(json.dumps({
        "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": query_length,
        "doc_maxlen": document_length, "attend_to_mask_tokens": attend_to_mask_tokens, "dim": dim,
        "similarity": "cosine", "mask_punctuation": True}))
    return directory


INSTRUCTION_PROMPTS = {"query": "Represent the query for retrieving passages: ", "document": ""}


def dense_embedder(directory: Path, pooling: str | list[str] = "mean", seed: int = 6,
                   include_prompt: bool = True) -> Path:
    """A BERT with pooling, two Dense layers (tanh with bias, then identity without) and Normalize;
    `include_prompt` False leaves an instruction prompt out of the pooling (INSTRUCTOR's way)."""
    base = bert_base(directory.parent / f"{directory.name}-base", seed)
    width = 32 * (len(pooling) if isinstance(pooling, list) else 1)
    after = [_pooling(32, pooling, include_prompt), _dense(width, 24, True, torch.nn.Tanh(), seed),
             _dense(24, 16, False, torch.nn.Identity(), seed + 1), _normalize()]
    return _sentence_transformer(directory, base, after, None if include_prompt else INSTRUCTION_PROMPTS)


def plain_embedder(directory: Path, pooling: str, seed: int = 7, include_prompt: bool = True) -> Path:
    """A BERT with one pooling mode and no Normalize; `include_prompt` as in `dense_embedder`."""
    base = bert_base(directory.parent / f"{directory.name}-base", seed)
    return _sentence_transformer(directory, base, [_pooling(32, pooling, include_prompt)],
                                 None if include_prompt else INSTRUCTION_PROMPTS)


LEGACY_TYPES = {"Transformer": "sentence_transformers.models.Transformer", "Pooling": "sentence_transformers.models.Pooling",
                "Dense": "sentence_transformers.models.Dense", "Normalize": "sentence_transformers.models.Normalize"}


def as_legacy(directory: Path) -> Path:
    """Rewrite a sentence-transformers 5 directory as 2.x-4.x wrote it: old module paths and the
    `pooling_mode_*` booleans."""
    modules = json.loads((directory / "modules.json").read_text())
    for module in modules:
        module["type"] = LEGACY_TYPES[module["type"].rsplit(".", 1)[-1]]
        if module["type"].endswith("Pooling"):
            path = directory / module["path"] / "config.json"
            config = json.loads(path.read_text())
            modes = config["pooling_mode"] if isinstance(config["pooling_mode"], list) else [config["pooling_mode"]]
            legacy = {"word_embedding_dimension": config["embedding_dimension"], "include_prompt": config["include_prompt"]}
            for mode, key in (("cls", "pooling_mode_cls_token"), ("mean", "pooling_mode_mean_tokens"),
                              ("max", "pooling_mode_max_tokens"), ("mean_sqrt_len_tokens", "pooling_mode_mean_sqrt_len_tokens"),
                              ("weightedmean", "pooling_mode_weightedmean_tokens"), ("lasttoken", "pooling_mode_lasttoken")):
                legacy[key] = mode in modes
            path.write_text(json.dumps(legacy))
    (directory / "modules.json").write_text(json.dumps(modules))
    return directory


def sparse_encoder(directory: Path, seed: int = 8, strategy: str = "max", activation: str = "relu",
                   modernbert: bool = False) -> Path:
    """SPLADE as `SparseEncoder` 5 saves it: a fill-mask Transformer (BERT, or ModernBERT on its
    byte-level tokenizer) and SpladePooling."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sparse_encoder.modules.splade_pooling import SpladePooling

    base_dir = directory.parent / f"{directory.name}-base"
    base = modernbert_base(base_dir, seed, masked_lm=True) if modernbert else bert_base(base_dir, seed, masked_lm=True)
    shutil.rmtree(directory, ignore_errors=True)
    transformer = Transformer(str(base), transformer_task="fill-mask")
    SparseEncoder(modules=[transformer, SpladePooling(pooling_strategy=strategy, activation_function=activation)]
                  ).save(str(directory))
    shutil.rmtree(base)
    return directory


def qwen3_reranker(directory: Path, seed: int = 9) -> Path:
    """Qwen3-Reranker's layout: Qwen3ForCausalLM (tied head) and a tokenizer holding "yes" and "no"."""
    from transformers import Qwen3ForCausalLM

    tokenizer = qwen_tokenizer(directory, append_eos=False)
    assert {"yes", "no"} <= set(tokenizer.get_vocab()), "the tiny vocabulary lacks yes/no"
    config = decoder_config("qwen3", len(tokenizer), tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                            architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(seed)
    _random(Qwen3ForCausalLM(config), seed).save_pretrained(directory)
    return directory


def modernbert_cross_encoder(directory: Path, seed: int = 13, spread: float = 10.0) -> Path:
    """gte-reranker-modernbert's layout: ModernBertForSequenceClassification with one logit on the
    byte-level tokenizer; its scores sharpened (`tiny_models.sharpened`) less than BERT's, whose spread
    would saturate its sigmoid."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    from tests.tiny_models import sharpened

    tokenizer = byte_level_tokenizer(directory)
    config = ModernBertConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, local_attention=8, global_attn_every_n_layers=2,
                              max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
                              cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id, num_labels=1,
                              architectures=["ModernBertForSequenceClassification"])
    torch.manual_seed(seed)
    model = _random(ModernBertForSequenceClassification(config), seed)
    sharpened(model, model.classifier, tokenizer, spread)
    model.save_pretrained(directory)
    return directory


def bert_cross_encoder(directory: Path, seed: int = 10, spread: float = 1000.0) -> Path:
    """A BERT cross-encoder as sentence-transformers' CrossEncoder models are saved (ms-marco-MiniLM's
    layout): BertForSequenceClassification with one logit, a WordPiece tokenizer with segment ids;
    its scores sharpened (`tiny_models.sharpened`)."""
    from transformers import BertConfig, BertForSequenceClassification

    from tests.tiny_models import sharpened

    tokenizer = wordpiece_tokenizer(directory, ("input_ids", "token_type_ids", "attention_mask"))
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=512, type_vocab_size=2, num_labels=1,
                        architectures=["BertForSequenceClassification"])
    torch.manual_seed(seed)
    model = _random(BertForSequenceClassification(config), seed)
    sharpened(model, model.classifier, tokenizer, spread)
    model.save_pretrained(directory)
    return directory


def static_embedder(directory: Path, seed: int = 14, normalize: bool = False, cut: int | None = None,
                    legacy: bool = False) -> Path:
    """sentence-transformers' `StaticEmbedding` (a random 24-dim table on the BERT-style tokenizer), as
    sentence-transformers 5 saves it at the model's root, or under `0_StaticEmbedding/` as older versions
    did (`legacy`); `normalize` adds a Normalize module, `cut` a truncation to the tokenizer file."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules.static_embedding import StaticEmbedding

    shutil.rmtree(directory, ignore_errors=True)
    backend = wordpiece_tokenizer(directory.parent / f"{directory.name}-tokenizer").backend_tokenizer
    if cut is not None:
        backend.enable_truncation(cut)
    torch.manual_seed(seed)
    modules = [StaticEmbedding(backend, embedding_dim=24), *([_normalize()] if normalize else [])]
    SentenceTransformer(modules=modules).save(str(directory))
    if legacy:  # the module's files in its own folder, as modules.json then names it
        folder = directory / "0_StaticEmbedding"
        folder.mkdir()
        for name in ("model.safetensors", "tokenizer.json"):
            (directory / name).rename(folder / name)
        entries = json.loads((directory / "modules.json").read_text())
        entries[0]["path"] = folder.name
        (directory / "modules.json").write_text(json.dumps(entries))
    return directory


def model2vec_embedder(directory: Path, seed: int = 15, quantized: bool = True) -> Path:
    """model2vec's `StaticModel` saved by its own `save_pretrained`: random 16-dim rows on the BERT-style
    tokenizer, a weight per token, normalised; `quantized` maps the vocabulary onto a third as many rows
    (its vocabulary quantization's `mapping`)."""
    import numpy as np
    from model2vec import StaticModel

    shutil.rmtree(directory, ignore_errors=True)
    backend = wordpiece_tokenizer(directory.parent / f"{directory.name}-tokenizer").backend_tokenizer
    rng = np.random.default_rng(seed)
    vocab = backend.get_vocab_size()
    rows = vocab // 3 if quantized else vocab
    model = StaticModel(vectors=rng.normal(size=(rows, 16)).astype(np.float32), tokenizer=backend, normalize=True,
                        weights=rng.uniform(0.5, 2.0, size=vocab).astype(np.float32),
                        token_mapping=rng.integers(0, rows, size=vocab) if quantized else None)
    model.save_pretrained(str(directory))
    return directory
