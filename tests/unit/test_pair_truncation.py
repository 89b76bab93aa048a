"""Pairs too long for the model are cut as the reference libraries cut them: longest-first as
`tokenizers` (TEI, sentence-transformers' CrossEncoder, transformers) does, or with FlagReranker's
capped query; by the tokenize stage, the gateway's token path and Cohere's chunked documents alike.
The served answers are compared with CrossEncoder and FlagReranker in tests/e2e/test_layouts_triton.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from prensa.gateway.core.chunking import document_room
from prensa.gateway.core.tokenization import Truncation, tokenize_items
from prensa.stages import contract, load_stage
from tests.tiny_layouts import bert_cross_encoder, wordpiece_tokenizer
from tests.tiny_models import tiny_reranker, xlmr_tokenizer

tokenize = load_stage("tokenize")
RULES = contract.PAIR_TRUNCATIONS
QUERY = "What is the capital of France? "
DOCUMENT = "Paris is the capital and largest city of France. "
# (query, document) pairs with the query, the document, both or neither past a 64-token window; the
# last fits the window with a query past FlagReranker's cap of 48 (53 + 2 tokens for the tiny unigram)
SHAPES = {"short": (QUERY, DOCUMENT), "long query": (QUERY * 30, DOCUMENT), "long document": (QUERY, DOCUMENT * 30),
          "both long": (QUERY * 30, DOCUMENT * 30), "query past the cap": (QUERY * 4 + "Capital?", "Paris.")}


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pair-tokenizers")
    xlmr_tokenizer(root / "unigram")
    wordpiece_tokenizer(root / "wordpiece", ("input_ids", "token_type_ids", "attention_mask"))
    return {kind: root / kind / "tokenizer.json" for kind in ("unigram", "wordpiece")}


def plain(path: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


@pytest.mark.parametrize("kind", ["unigram", "wordpiece"])
def test_longest_first_lengths_are_tokenizers_own(tokenizer_files, kind):
    """`pair_lengths` against `tokenizers`' LongestFirst itself, over every pair of lengths that
    needs cutting around a few windows (odd and even rooms, equal lengths, one text past the room)."""
    counting, cutting = plain(tokenizer_files[kind]), Tokenizer.from_file(str(tokenizer_files[kind]))
    for max_length in (9, 10, 13, 16):
        cutting.enable_truncation(max_length, strategy="longest_first")
        room = max_length - cutting.num_special_tokens_to_add(True)
        for a in range(1, 22):
            for b in range(1, 22):
                first, second = " ".join(["berlin"] * a), " ".join(["paris"] * b)
                lengths = [len(counting.encode(t, add_special_tokens=False)) for t in (first, second)]
                sequence = cutting.encode(first, second).sequence_ids
                kept = (sequence.count(0), sequence.count(1))
                assert contract.pair_lengths(*lengths, room, contract.LONGEST_FIRST, max_length) == kept, (
                    max_length, lengths)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_stage_cuts_longest_first_as_transformers_does(tokenizer_files, shape, side):
    from transformers import PreTrainedTokenizerFast

    for path in tokenizer_files.values():
        reference = PreTrainedTokenizerFast.from_pretrained(path.parent, truncation_side=side)
        encoder = tokenize.TextEncoder(path, 64, side, contract.LONGEST_FIRST)
        query, document = SHAPES[shape]
        pairs = [(query, document), (document, query)]
        got = encoder.encode_requests([pairs])[0]
        want = reference([p[0] for p in pairs], [p[1] for p in pairs], truncation=True, max_length=64)
        assert [e.ids for e in got] == want["input_ids"]
        if "token_type_ids" in want:
            assert [e.type_ids for e in got] == want["token_type_ids"]


def flag_reranker_tokens(directory: Path, pairs: list[tuple[str, str]], max_length: int) -> list[list[int]]:
    """The token rows FlagReranker itself feeds its model (a hook on the model reads them), in its own
    order (longest first), after the pass it first makes to probe the batch size."""
    from FlagEmbedding import FlagReranker

    reranker = FlagReranker(str(directory), use_fp16=False, devices="cpu")
    rows: list[list[int]] = []

    def record(_module, _args, kwargs):
        for ids, mask in zip(kwargs["input_ids"].tolist(), kwargs["attention_mask"].tolist()):
            rows.append(ids[: sum(mask)])

    hook = reranker.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        reranker.compute_score([list(pair) for pair in pairs], max_length=max_length, batch_size=1)
    finally:
        hook.remove()
    return rows[-len(pairs):]


def test_the_stage_cuts_a_capped_query_as_flagreranker_does(tmp_path):
    directory = tiny_reranker(tmp_path / "reranker")
    pairs = list(SHAPES.values())
    encoder = tokenize.TextEncoder(directory / "tokenizer.json", 64, "right", contract.CAPPED_QUERY)
    got = [e.ids for e in encoder.encode_requests([pairs])[0]]
    assert sorted(got) == sorted(flag_reranker_tokens(directory, pairs, 64))
    longest_first = tokenize.TextEncoder(directory / "tokenizer.json", 64, "right", contract.LONGEST_FIRST)
    same = {shape: a.ids == b for shape, a, b in zip(SHAPES, longest_first.encode_requests([pairs])[0], got)}
    assert same == {"short": True, "long query": False, "long document": True, "both long": False,
                    "query past the cap": False}, "the rules agree while the query fits its cap"


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("side", ["right", "left"])
def test_the_gateway_cuts_pairs_as_the_stage_does(tokenizer_files, rule, side):
    for path in tokenizer_files.values():
        encoder = tokenize.TextEncoder(path, 64, side, rule)
        pairs = list(SHAPES.values())
        stage = encoder.encode_requests([pairs])[0]
        rows = tokenize_items(plain(path), [p[0] for p in pairs], [p[1] for p in pairs], 64, Truncation(True, side),
                              10**6, rule)
        assert rows.ids == [e.ids for e in stage] and rows.type_ids == [e.type_ids for e in stage]
        assert rows.cut


def test_a_pair_rule_the_stage_does_not_know_is_refused(tokenizer_files):
    with pytest.raises(ValueError, match="only_second"):
        tokenize.TextEncoder(tokenizer_files["unigram"], 64, "right", "only_second")


@pytest.mark.parametrize("rule", RULES)
def test_a_document_window_is_read_whole_beside_its_query(rule):
    """Cohere's chunked documents: a window of `document_room` tokens is kept whole beside the query,
    one token more is not (or no more fits)."""
    max_length, specials = 64, 4
    room = max_length - specials
    for query in range(0, 200):
        size = document_room(query, max_length, specials, rule)
        assert size >= 1 and contract.pair_lengths(query, size, room, rule, max_length)[1] == size, query
        assert contract.pair_lengths(query, size + 1, room, rule, max_length)[1] <= size, query
    # a long query leaves a longest-first document half the room, not nothing
    assert document_room(500, max_length, specials, contract.LONGEST_FIRST) == room - room // 2


def test_the_tiny_cross_encoder_layouts_are_what_their_libraries_load(tmp_path):
    """The builders the served comparisons use: CrossEncoder loads the BERT one, with segment ids."""
    from sentence_transformers import CrossEncoder

    directory = bert_cross_encoder(tmp_path / "bert")
    scores = CrossEncoder(str(directory), activation_fn=torch.nn.Identity()).predict(
        [(QUERY, DOCUMENT), (QUERY, "bananas")])
    assert abs(float(scores[0]) - float(scores[1])) > 1e-3
