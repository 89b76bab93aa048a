"""The encode stage's GPU batching: shape buckets, no length-ratio cut, budgets, every row once, passes
cut where they cost least (launches against padding), the packed graph and CUDA graphs in the plan,
the four traffic mixes on paper, the policy a config gets, and results equal to the CPU rule's on a
real (tiny) bge-m3 graph."""

from __future__ import annotations

import numpy as np
import pytest

from prensa.bench import gpu_mixes
from prensa.export.pipeline import ExportOptions, export_model
from prensa.manifest import Manifest
from prensa.stages import contract, load_stage
from prensa.triton.repo import ServingOptions, pool_parameters

encode = load_stage("encode")
tokenize = load_stage("tokenize")
pool = load_stage("pool")


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@pytest.mark.parametrize("max_length", [8, 31, 32, 100, 300, 512, 514, 8192])
def test_length_buckets_are_powers_of_two_from_32_ending_at_max_length(max_length):
    buckets = contract.gpu_length_buckets(max_length)
    assert buckets[-1] == max_length
    assert list(buckets) == sorted(set(buckets))
    assert all(is_power_of_two(b) and b >= 32 for b in buckets[:-1])
    # every power of two from 32 below the max length is a bucket: a row wastes at most half its width
    assert [b for b in buckets[:-1]] == [2**k for k in range(5, 14) if 2**k < max_length]


def test_length_buckets_without_a_max_length_stop_at_512_and_longer_rows_keep_their_width():
    buckets = contract.gpu_length_buckets(None)
    assert buckets == (32, 64, 128, 256, 512)
    assert encode.bucket(513, buckets) == 513 and encode.bucket(1, buckets) == 32 and encode.bucket(65, buckets) == 128


@pytest.mark.parametrize("max_rows, expected", [(1, (1,)), (48, (1, 2, 4, 8, 16, 32, 48)), (64, (1, 2, 4, 8, 16, 32, 64))])
def test_row_buckets(max_rows, expected):
    assert contract.row_buckets(max_rows) == expected


def plan_cost(policy, lengths, batches) -> float:
    """What a plan costs by the policy's own measure (`GpuBatching.cost`)."""
    return sum(float(policy.cost(np.array([len(b)]), int(lengths[b].max()), np.array([int(lengths[b].sum())]))[0])
               for b in batches)


def greedy_fill(policy, lengths) -> list[np.ndarray]:
    """The plan before the cost-based cut: longest first, each pass filled to the budget at its bucket."""
    order, batches, start = encode.longest_first(lengths), [], 0
    while start < len(order):
        take = policy.row_cap(encode.bucket(int(lengths[order[start]]), policy.length_buckets))
        batches.append(order[start:start + take])
        start += take
    return batches


@pytest.mark.parametrize("seed", range(25))
def test_gpu_plan_covers_every_row_once_within_budget_and_costs_least(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 513, size=rng.integers(1, 300))
    budget, max_rows = int(rng.choice([2048, 16384, 131072])), int(rng.choice([8, 48, 64]))
    policy = encode.GpuBatching(budget, max_rows, contract.gpu_length_buckets(512))
    batches = policy.plan(lengths)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    for batch in batches:
        rows, width = policy.shape(lengths[batch].tolist())
        assert width >= lengths[batch].max() and width in policy.length_buckets
        assert len(batch) <= rows <= max_rows
        assert rows * width <= budget or len(batch) == 1
        assert (rows, width) in policy.shapes()
    # no worse than filling each pass, nor than a pass per row
    assert plan_cost(policy, lengths, batches) <= plan_cost(policy, lengths, greedy_fill(policy, lengths)) + 1e-6
    assert plan_cost(policy, lengths, batches) <= plan_cost(policy, lengths, [np.array([i]) for i in
                                                                             range(len(lengths))]) + 1e-6


def test_a_long_row_is_cut_off_where_its_padding_costs_more_than_a_pass():
    policy = encode.GpuBatching(contract.DEFAULT_GPU_MAX_BATCH_TOKENS, 256, contract.gpu_length_buckets(512))
    lengths = np.array([20] * 100 + [500] + [20] * 155)
    assert [b.tolist() for b in policy.plan(lengths)] == [[100], [i for i in range(256) if i != 100]]
    # a row only a little longer stays: splitting would save less padding than a pass costs
    lengths = np.array([20] * 7 + [60])
    assert len(policy.plan(lengths)) == 1


def test_packed_passes_fill_real_tokens_and_take_their_own_shape():
    policy = encode.GpuBatching(contract.DEFAULT_GPU_MAX_BATCH_TOKENS, 1024, contract.gpu_length_buckets(512),
                                packed_max_tokens=4096)
    lengths = np.array([500, *[20] * 300])
    batches = policy.plan(lengths)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    assert all(lengths[b].sum() <= 4096 for b in batches)
    assert len(batches) == 2  # as few as the 6,500 real tokens allow: lengths are no reason to cut
    longest = next(b for b in batches if 0 in b)
    assert policy.shape(lengths[longest].tolist()) == (len(longest), 500)  # its own shape: padding is free


def test_small_passes_take_their_captured_shape():
    base = encode.GpuBatching(contract.DEFAULT_GPU_MAX_BATCH_TOKENS, 1024, contract.gpu_length_buckets(512))
    captured = frozenset(encode.captured_shapes(base, contract.DEFAULT_CUDA_GRAPH_MAX_TOKENS))
    assert captured and all(r * w <= contract.DEFAULT_CUDA_GRAPH_MAX_TOKENS for r, w in captured)
    policy = encode.GpuBatching(base.max_batch_tokens, base.max_rows, base.length_buckets, captured=captured,
                                packed_max_tokens=contract.DEFAULT_PACKED_MAX_TOKENS)
    assert policy.shape([12]) == (1, 32) and policy.shape([30, 9, 17]) == (4, 32)
    assert policy.shape([300] * 100) == (100, 300)  # past the captured shapes: the packed graph


def test_gpu_plan_never_cuts_on_length_ratio():
    lengths = np.array([3, 40, 90, 200, 500, 7, 12])  # the CPU rule cuts these into many sub-batches
    cpu = encode.plan_sub_batches(lengths, 131072, contract.DEFAULT_LENGTH_RATIO, 64)
    gpu = encode.GpuBatching(131072, 64, contract.gpu_length_buckets(512)).plan(lengths)
    assert len(cpu) >= 5
    assert [b.tolist() for b in gpu] == [[4, 3, 2, 1, 6, 5, 0]]  # one pass, longest first


def test_gpu_plan_cuts_on_the_budget_at_the_bucket_length():
    lengths = np.full(40, 100)  # bucket 128: 1024 // 128 = 8 rows a pass
    batches = encode.GpuBatching(1024, 64, contract.gpu_length_buckets(512)).plan(lengths)
    assert [len(b) for b in batches] == [8] * 5


def test_row_past_the_budget_runs_alone():
    policy = encode.GpuBatching(256, 64, contract.gpu_length_buckets(512))
    batches = policy.plan(np.array([10, 500, 12]))
    assert [b.tolist() for b in batches] == [[1], [2, 0]]
    assert policy.shape([500]) == (1, 512)


def test_gpu_shapes_are_few_and_within_the_budget():
    policy = encode.GpuBatching(contract.DEFAULT_GPU_MAX_BATCH_TOKENS, 64, contract.gpu_length_buckets(8192))
    shapes = policy.shapes()
    assert len(shapes) <= len(policy.length_buckets) * len(contract.row_buckets(64))
    assert all(rows * width <= policy.max_batch_tokens for rows, width in shapes)
    assert (64, 512) in shapes and (16, 8192) in shapes and (1, 32) in shapes


def params(**extra: str) -> dict[str, str]:
    return {"max_batch_tokens": "16384", **extra}


@pytest.mark.parametrize("given, kind", [
    (params(execution_provider="cuda"), encode.GpuBatching),
    (params(execution_provider="cuda", length_ratio="1.25"), encode.CpuBatching),  # an explicit ratio is kept
    (params(execution_provider="cpu"), encode.CpuBatching),
    (params(), encode.CpuBatching),
    (params(execution_provider="cuda", batching="cpu"), encode.CpuBatching),
    (params(execution_provider="cpu", batching="gpu", length_ratio="1.25"), encode.GpuBatching),
])
def test_policy_follows_the_provider_unless_told(given, kind):
    assert isinstance(encode.batching_policy(given, 64), kind)


def test_gpu_policy_reads_its_budget_and_buckets_from_the_config():
    default = encode.batching_policy(params(execution_provider="cuda", max_length="8192"), 32)
    assert default == encode.GpuBatching(contract.DEFAULT_GPU_MAX_BATCH_TOKENS, 32, contract.gpu_length_buckets(8192))
    assert contract.DEFAULT_GPU_MAX_BATCH_TOKENS > contract.DEFAULT_MAX_BATCH_TOKENS
    tuned = encode.batching_policy(params(execution_provider="cuda", gpu_max_batch_tokens="65536",
                                          length_buckets="256,64,512"), 32)
    assert tuned == encode.GpuBatching(65536, 32, (64, 256, 512))
    with pytest.raises(ValueError, match="batching"):
        encode.batching_policy(params(batching="tpu"), 32)


class EchoSession:
    """Echoes ids as per-token features; records each input shape."""

    def __init__(self):
        self.shapes = []

    def get_inputs(self):
        return [type("I", (), {"name": n})() for n in ("input_ids", "attention_mask")]

    def get_outputs(self):
        return [type("O", (), {"name": "last_hidden_state"})()]

    def run(self, names, feed, options=None):
        assert feed["attention_mask"].sum(axis=1).min() > 0, "an all-masked row reached the graph"
        self.shapes.append(feed["input_ids"].shape)
        return [feed["input_ids"][..., None].astype(np.float32)]


def ragged(rng, count):
    requests = []
    for _ in range(count):
        lengths = rng.integers(1, 200, size=rng.integers(1, 4))
        ids = np.zeros((len(lengths), lengths.max()), dtype=np.int64)
        for row, length in enumerate(lengths):
            ids[row, :length] = rng.integers(5, 1000, size=length)
        requests.append({"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64), "token_type_ids": 0 * ids})
    return requests


def test_encoder_pads_to_bucket_shapes_and_returns_each_request_its_rows():
    session = EchoSession()
    policy = encode.GpuBatching(4096, 16, contract.gpu_length_buckets(256))
    encoder = encode.TokenBudgetEncoder(session, 0, 16384, 1.25, 16, {"last_hidden_state"}, batching=policy)
    requests = ragged(np.random.default_rng(3), 30)
    results = encoder.encode(requests)
    for request, result in zip(requests, results):
        np.testing.assert_array_equal(result["last_hidden_state"][..., 0], request["input_ids"])
    assert set(session.shapes) <= set(policy.shapes())
    assert encoder.padded_tokens == sum(r * w for r, w in session.shapes)
    assert encoder.real_tokens == sum(int(r["attention_mask"].sum()) for r in requests)


@pytest.fixture(scope="module")
def m3_export(tmp_path_factory, m3_dir):
    out = tmp_path_factory.mktemp("gpu-batching") / "bge-m3"
    export_model(ExportOptions(str(m3_dir), out))
    return out


def stage_config(export, manifest, **extra: str) -> dict:
    values = {"onnx_file": manifest.onnx_file, "max_batch_tokens": "16384", "pad_id": str(manifest.pad_id),
              "intra_op_threads": "1", "per_token_outputs": ",".join(o.name for o in manifest.outputs if o.per_token),
              **extra}
    return {"max_batch_size": 16, "parameters": {k: {"string_value": v} for k, v in values.items()}}


def test_gpu_policy_gives_the_cpu_rules_results_on_a_real_graph(m3_export):
    manifest = Manifest.read(m3_export)
    text_encoder = tokenize.TextEncoder(m3_export / manifest.tokenizer_file, manifest.max_length)
    rng = np.random.default_rng(0)
    words = ["dense", "sparse", "late", "interaction", "passage", "query", "capital", "city", "river", "museum"]
    texts = [[" ".join(rng.choice(words, size=rng.integers(1, 120))) for _ in range(rng.integers(1, 4))]
             for _ in range(24)]
    tokens = [tokenize.pad_encodings(e, manifest.pad_id) for e in text_encoder.encode_requests(texts)]

    cpu = encode.load_encoder(stage_config(m3_export, manifest, length_ratio="1.25"), m3_export)
    gpu = encode.load_encoder(stage_config(m3_export, manifest, batching="gpu", max_length=str(manifest.max_length)),
                              m3_export)
    assert isinstance(cpu.batching, encode.CpuBatching) and isinstance(gpu.batching, encode.GpuBatching)
    pooler = pool.Pooler.from_parameters(pool_parameters(manifest, ServingOptions()))
    got, want = gpu.encode(tokens), cpu.encode(tokens)
    assert gpu.padded_tokens > cpu.padded_tokens  # the buckets did pad more, so the comparison means something
    for request, g, w in zip(tokens, got, want):
        mask = request[contract.ATTENTION_MASK].astype(bool)
        for name in w:
            np.testing.assert_allclose(g[name][mask], w[name][mask], rtol=1e-4, atol=1e-5)
        pooled_g, pooled_w = pooler({**request, **g}), pooler({**request, **w})
        assert set(pooled_g) == set(pooled_w) >= {contract.DENSE, contract.SPARSE_WEIGHTS, contract.COLBERT}
        for name in pooled_w:
            np.testing.assert_allclose(pooled_g[name], pooled_w[name], rtol=1e-4, atol=1e-5)


def test_cuda_config_gets_the_gpu_policy_only_where_cuda_runs(m3_export, capfd):
    """On a machine without onnxruntime's CUDA provider the stage falls back to the CPU, and with it
    to the CPU rule: bucket warm-up and 131072-token passes are for a GPU."""
    manifest = Manifest.read(m3_export)
    config = stage_config(m3_export, manifest, execution_provider="cuda", max_length=str(manifest.max_length))
    encoder = encode.load_encoder(config, m3_export)
    on_gpu = encoder.session.get_providers()[0] == encode.CUDA_PROVIDER
    assert isinstance(encoder.batching, encode.GpuBatching if on_gpu else encode.CpuBatching)
    if not on_gpu:
        assert "running on CPUExecutionProvider" in capfd.readouterr().err
        assert encoder.batching.length_ratio == contract.DEFAULT_LENGTH_RATIO


def test_rendered_cuda_encoder_config_asks_for_the_gpu_policy(m3_export, tmp_path):
    from prensa.triton.repo import ModelSource, build_repository

    manifest = Manifest.read(m3_export)
    build_repository([ModelSource("m3", m3_export, manifest)], tmp_path / "cuda", ServingOptions(execution_provider="cuda"))
    build_repository([ModelSource("m3", m3_export, manifest)], tmp_path / "cpu", ServingOptions())
    cuda = (tmp_path / "cuda" / "m3_encode" / "config.pbtxt").read_text()
    cpu = (tmp_path / "cpu" / "m3_encode" / "config.pbtxt").read_text()
    assert "length_ratio" not in cuda and '"max_length"' in cuda
    assert "length_ratio" in cpu and '"max_length"' not in cpu
    params = {"execution_provider": "cuda", "max_batch_tokens": "16384", "max_length": str(manifest.max_length)}
    assert isinstance(encode.batching_policy(params, 16, cuda_active=True), encode.GpuBatching)
    assert isinstance(encode.batching_policy(params, 16, cuda_active=False), encode.CpuBatching)


def traffic_figures(mix: str, policy, window: int):
    lengths = gpu_mixes.token_lengths(mix)
    return lengths, gpu_mixes.planned(lengths, policy, window)


def gpu_policy(packed: bool) -> object:
    window = contract.GPU_WINDOW_ROWS
    base = encode.GpuBatching(contract.DEFAULT_GPU_MAX_BATCH_TOKENS, window, contract.gpu_length_buckets(512))
    return encode.GpuBatching(base.max_batch_tokens, window, base.length_buckets,
                              captured=frozenset(encode.captured_shapes(base, contract.DEFAULT_CUDA_GRAPH_MAX_TOKENS)),
                              packed_max_tokens=contract.DEFAULT_PACKED_MAX_TOKENS if packed else None)


@pytest.mark.parametrize("mix", gpu_mixes.MIXES)
def test_the_packed_policy_reaches_sorted_batches_on_every_mix(mix):
    """Issue 46's bar on paper (the H200's figures, `gpu_mixes.PassCost`): with the packed graph and
    CUDA graphs, a window of the stage's rows at a time, at least 0.9 of sorted batches on the same
    engine, computing no padding but what captured shapes pad."""
    lengths, figures = traffic_figures(mix, gpu_policy(packed=True), contract.GPU_WINDOW_ROWS)
    assert figures.real_tokens == int(lengths.sum())
    assert gpu_mixes.sorted_ms(lengths, packed=True) / figures.ms >= 0.9, figures
    assert figures.padding <= 1.1, figures  # only the small passes replayed from CUDA graphs pad
    # passes that pay every launch are few: what the real tokens need, and one more a window
    windows = -(-len(lengths) // contract.GPU_WINDOW_ROWS)
    eager = figures.passes - figures.replayed
    assert eager <= int(lengths.sum()) // contract.DEFAULT_PACKED_MAX_TOKENS + 2 * windows, figures


def test_the_unpacked_policy_no_longer_pads_a_window_to_its_longest_row():
    """Without a packed graph (TensorRT, an unfused export), the realistic mix: the cost-based cut
    against the old fill-the-budget plan, which padded 4.3 tokens for each real one."""
    policy = gpu_policy(packed=False)
    lengths, figures = traffic_figures("realistic", policy, 256)
    old = [(policy.bucket_shape(len(b), int(w[b].max())), int(w[b].sum()), False, False)
           for w in gpu_mixes.windows(lengths, 256) for b in greedy_fill(policy, w)]
    before = gpu_mixes.plan_figures(old)
    assert before.padding > 3.5 and figures.padding < 1.6, (before, figures)
    assert figures.ms < 0.6 * before.ms


class EchoGraphs:
    """Stands in for `CudaGraphs`: replays the shapes it holds, echoing ids as EchoSession does."""

    def __init__(self, shapes):
        self.bound, self.shapes = set(shapes), []

    def __contains__(self, shape):
        return shape in self.bound

    def run(self, feed):
        self.shapes.append(feed["input_ids"].shape)
        return [feed["input_ids"][..., None].astype(np.float32)]


def test_each_pass_runs_where_the_plan_meant_it_to():
    """Captured shapes replay their CUDA graph, other passes go to the packed graph at their own shape,
    and the padded-token counter counts what each computes (real tokens on the packed graph)."""
    plain, packed = EchoSession(), EchoSession()
    base = encode.GpuBatching(4096, 64, contract.gpu_length_buckets(256))
    captured = frozenset(encode.captured_shapes(base, 512))
    graphs = EchoGraphs(captured)
    policy = encode.GpuBatching(4096, 64, base.length_buckets, captured=captured, packed_max_tokens=2048)
    encoder = encode.TokenBudgetEncoder(plain, 0, 16384, 1.25, 64, {"last_hidden_state"}, batching=policy,
                                        packed=packed, graphs=graphs)
    requests = ragged(np.random.default_rng(4), 60)
    for request, result in zip(requests, encoder.encode(requests)):
        np.testing.assert_array_equal(result["last_hidden_state"][..., 0], request["input_ids"])
    assert graphs.shapes and packed.shapes and not plain.shapes
    assert set(graphs.shapes) <= captured and not set(packed.shapes) & captured
    real = sum(int(r["attention_mask"].sum()) for r in requests)
    replayed = sum(r * w for r, w in graphs.shapes)
    assert encoder.real_tokens == real and real < encoder.padded_tokens <= real + replayed
