"""Tiny randomly initialised models with the real architectures and file layouts, built on the fly.

No package ships bge-m3 or bge-reranker-v2-m3 weights; these share their architecture
(XLM-RoBERTa), tokenizer kind (SentencePiece-style unigram) and head files, so every code path
is exercised against the reference implementations on identical weights.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from pathlib import Path

import torch
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

CORPUS = [
    "Berlin is the capital and largest city of Germany.",
    "Paris is the capital of France and home of the Louvre museum.",
    "Dense retrieval encodes queries and passages into vectors.",
    "Sparse retrieval weights individual terms of a document.",
    "Late interaction keeps one vector per token and scores with max similarity.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Triton Inference Server batches requests dynamically on CPUs and GPUs.",
    "Rerankers score a query together with each candidate passage.",
    "Émilie a mangé une pomme à Montréal; 東京は日本の首都です。",
] * 20
XLMR_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def corpus_words(corpus: list[str], normalizer: normalizers.Normalizer, pre_tokenizer: pre_tokenizers.PreTokenizer) -> list[str]:
    """The corpus's words as a tokenizer splits them, the most frequent first and ties by their text:
    a vocabulary built from them is the same on every run, where the trainers of `tokenizers` break
    ties in hash order and give another vocabulary, so other random models, on each run."""
    counts = Counter(word for text in corpus for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    return sorted(counts, key=lambda word: (-counts[word], word))


def unigram_model(corpus: list[str], specials: list[str], unk: str) -> models.Unigram:
    """A unigram vocabulary of the corpus's whole words (after Metaspace) and its single characters,
    words far likelier than characters, so a seen word is one token and any other text splits."""
    words = corpus_words(corpus, normalizers.NFKC(), pre_tokenizers.Metaspace())
    scores = {piece: 0.0 for piece in specials}
    scores.update({word: -1.0 - rank / 1000 for rank, word in enumerate(words) if word not in scores})
    scores.update({char: -20.0 for char in sorted({c for word in words for c in word}) if char not in scores})
    return models.Unigram(list(scores.items()), unk_id=specials.index(unk), byte_fallback=False)


def xlmr_tokenizer(directory: Path, model_max_length: int = 512):
    """A unigram tokenizer with XLM-R's special tokens, ids and templates, saved as a fast tokenizer."""
    from transformers import XLMRobertaTokenizerFast

    tok = Tokenizer(unigram_model(CORPUS, XLMR_SPECIALS, "<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    fast = XLMRobertaTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=model_max_length,
    )
    fast.save_pretrained(directory)
    return fast


def xlmr_config(vocab_size: int, **extra):
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=514, pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1, **extra,
    )


def tiny_bge_m3(directory: Path, with_heads: tuple[str, ...] = ("sparse_linear.pt", "colbert_linear.pt")) -> Path:
    """XLMRobertaModel + sparse_linear.pt (positive bias, so sparse weights are non-empty) + colbert_linear.pt."""
    from transformers import XLMRobertaModel

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = xlmr_tokenizer(directory)
    torch.manual_seed(0)
    config = xlmr_config(len(tokenizer), architectures=["XLMRobertaModel"])
    XLMRobertaModel(config, add_pooling_layer=False).save_pretrained(directory)
    sparse = torch.nn.Linear(32, 1)
    torch.nn.init.constant_(sparse.bias, 0.5)
    heads = {"sparse_linear.pt": sparse, "colbert_linear.pt": torch.nn.Linear(32, 32)}
    for name in with_heads:
        torch.save(heads[name].state_dict(), directory / name)
    return directory


def sharpened(model: torch.nn.Module, head: torch.nn.Linear, tokenizer, spread: float) -> torch.nn.Module:
    """`model` with its last layer's weights times `spread` and its bias set so that pairs of the
    corpus score about 0: a tiny random encoder reads its inputs faintly, and this makes what it
    reads show in the scores without a sigmoid saturating."""
    pairs = list(pairwise(CORPUS[:9]))
    with torch.no_grad():
        head.weight.mul_(spread)
        encoded = tokenizer([p[0] for p in pairs], [p[1] for p in pairs], padding=True, return_tensors="pt")
        head.bias.sub_(model(**encoded).logits.mean(0))
    return model


def _tiny_sequence_classifier(directory: Path, id2label: dict[int, str], seed: int, spread: float | None = None) -> Path:
    from transformers import XLMRobertaForSequenceClassification

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = xlmr_tokenizer(directory)
    torch.manual_seed(seed)
    config = xlmr_config(len(tokenizer), architectures=["XLMRobertaForSequenceClassification"],
                         num_labels=len(id2label), id2label=id2label, label2id={v: k for k, v in id2label.items()})
    model = XLMRobertaForSequenceClassification(config).eval()
    if spread is None:
        with torch.no_grad():  # spread the logits so orderings and softmaxes are not all ties
            model.classifier.out_proj.weight.mul_(20.0)
    else:
        sharpened(model, model.classifier.out_proj, tokenizer, spread)
    model.save_pretrained(directory)
    return directory


def tiny_reranker(directory: Path, spread: float | None = None) -> Path:
    """bge-reranker-v2-m3's layout: XLMRobertaForSequenceClassification with one logit; `spread`
    sharpens its scores (`sharpened`)."""
    return _tiny_sequence_classifier(directory, {0: "LABEL_0"}, seed=1, spread=spread)


def tiny_classifier(directory: Path) -> Path:
    """A three-label classifier with named labels."""
    return _tiny_sequence_classifier(directory, {0: "negative", 1: "neutral", 2: "positive"}, seed=2)


PROMPTS = {"query": "query: ", "passage": "passage: "}  # e5's convention


def prompted_copy(source: Path, directory: Path, prompts: dict[str, str] = PROMPTS) -> Path:
    """`source` (a sentence-transformers directory) with `prompts` in its config_sentence_transformers.json;
    the weights are linked, not copied."""
    import json
    import shutil

    shutil.copytree(source, directory, symlinks=True,
                    ignore=lambda _, names: [n for n in names if n.endswith(".safetensors")])
    for weights in source.glob("*.safetensors"):
        (directory / weights.name).symlink_to(weights.resolve())
    config_path = directory / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config_path.write_text(json.dumps({**config, "prompts": prompts, "default_prompt_name": None}))
    return directory
