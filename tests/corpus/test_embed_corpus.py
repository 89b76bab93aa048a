"""`prensa embed-corpus` on 5,000 texts with the tiny bge-m3: every id exactly once, the vectors the
server gives, a SIGKILLed run resumed without duplicates or gaps, and a two-worker Ray run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tritonclient.grpc as grpcclient
from rich.console import Console
from typer.testing import CliRunner

from prensa.cli import app
from prensa.corpus.backends import BackendSpec
from prensa.corpus.io import RECORD_FILE
from prensa.corpus.local import Job
from prensa.workload import embedding_texts

TEXTS = 5000


@lru_cache(maxsize=1)
def corpus_rows() -> list[dict[str, str]]:
    """Real prose cut to 40 words: long enough to batch like passages, short enough for 2 cores."""
    texts = embedding_texts(TEXTS)
    return [{"id": f"doc-{i:05d}", "text": " ".join(text.split()[:40])} for i, text in enumerate(texts)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", corpus_rows())


def embed(*args: object, code: int = 0) -> str:
    result = CliRunner().invoke(app, ["embed-corpus", *map(str, args)], env={"COLUMNS": "1000"})  # paths unwrapped
    assert result.exit_code == code, result.output
    return " ".join(result.output.split())


@pytest.fixture(scope="module")
def local(tmp_path_factory, exports, corpus) -> Path:
    out = tmp_path_factory.mktemp("local")
    embed(corpus, out, "--export", exports["bge-m3"], "--outputs", "dense,sparse,colbert", "--rows-per-part", 1000)
    return out


def read(out: Path, id_column: str = "id") -> pa.Table:
    return pq.read_table(out).sort_by(id_column)


def dense(table: pa.Table) -> np.ndarray:
    return table["dense"].combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)


def sparse(table: pa.Table) -> list[dict[int, float]]:
    return [{term["index"]: term["value"] for term in row} for row in table["sparse"].to_pylist()]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def assert_same_vectors(table: pa.Table, reference: pa.Table) -> None:
    assert table["id"].to_pylist() == reference["id"].to_pylist()
    assert cosine(dense(table), dense(reference)).min() >= 0.9999
    for got, expected in zip(sparse(table), sparse(reference)):
        assert got.keys() == expected.keys()
        np.testing.assert_allclose(list(got.values()), list(expected.values()), atol=1e-4)


def test_every_input_id_exactly_once_with_typed_columns(local):
    table = read(local)
    assert table["id"].to_pylist() == [row["id"] for row in corpus_rows()]
    assert table.schema.field("dense").type == pa.list_(pa.float32(), 32)
    assert table.schema.field("sparse").type == pa.list_(pa.struct([("index", pa.int32()), ("value", pa.float32())]))
    assert table.schema.field("colbert").type == pa.list_(pa.list_(pa.float32(), 32))
    head = table.slice(0, 50)
    assert [len(v) for v in head["colbert"].to_pylist()] == [n - 1 for n in head["num_tokens"].to_pylist()]
    assert sorted(p.name for p in local.iterdir()) == [RECORD_FILE] + [f"part-{i:05d}.parquet" for i in range(5)]
    assert json.loads((local / RECORD_FILE).read_text())["outputs"] == ["dense", "sparse", "colbert"]


@pytest.mark.triton
def test_vectors_equal_the_servers(triton, local):
    table = read(local)
    rows = sorted(np.random.default_rng(0).choice(TEXTS, 64, replace=False).tolist())
    texts = [corpus_rows()[i]["text"] for i in rows]
    tensor = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    served = grpcclient.InferenceServerClient(triton.grpc_url).infer("bge-m3", [tensor])
    sample = table.take(rows)
    assert cosine(dense(sample), served.as_numpy("dense")).min() >= 0.9999
    ids, weights = served.as_numpy("sparse_ids"), served.as_numpy("sparse_weights")
    for row, terms in enumerate(sparse(sample)):
        real = ids[row] >= 0
        assert list(terms) == ids[row][real].tolist()
        np.testing.assert_allclose(list(terms.values()), weights[row][real], atol=1e-4)
    colbert, num_tokens = served.as_numpy("colbert"), served.as_numpy("num_tokens")
    for row, vectors in enumerate(sample["colbert"].to_pylist()):
        np.testing.assert_allclose(np.array(vectors), colbert[row, : num_tokens[row, 0] - 1], atol=1e-4)


@pytest.mark.triton
@pytest.mark.parametrize("model", ["bge-m3", "bge-m3-fused"])
def test_through_triton_grpc_from_parquet_with_other_column_names(model, triton, local, tmp_path):
    rows = corpus_rows()[:600]
    table = pa.table({"doc": [r["id"] for r in rows], "body": [r["text"] for r in rows]})
    pq.write_table(table, tmp_path / "in.parquet")
    embed(tmp_path / "in.parquet", tmp_path / "out", "--triton-url", triton.grpc_url, "--model", model,
          "--id-column", "doc", "--text-column", "body", "--rows-per-part", 256, "--batch-size", 32)
    table = read(tmp_path / "out", "doc").rename_columns(["id", "dense", "sparse", "num_tokens"])
    assert_same_vectors(table, read(local).slice(0, 600).select(["id", "dense", "sparse", "num_tokens"]))


def test_killed_run_resumes_without_duplicates_or_gaps(exports, corpus, tmp_path):
    out = tmp_path / "out"
    arguments = ["embed-corpus", str(corpus), str(out), "--export", str(exports["bge-m3"]), "--rows-per-part", "200"]
    process = subprocess.Popen([str(Path(sys.executable).parent / "prensa"), *arguments],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list(out.glob("part-*.parquet"))) < 4:
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no parts written in time"
        time.sleep(0.02)
    process.kill()  # SIGKILL: no cleanup, possibly in the middle of writing a part
    process.wait()
    before = {path.name: path.read_bytes() for path in out.glob("part-*.parquet")}
    assert 4 <= len(before) < TEXTS // 200
    (out / ".part-09999.parquet.tmp").write_bytes(b"half a part")  # what a kill during a write leaves

    output = embed(*arguments[1:])
    done = sum(pq.read_metadata(out / name).num_rows for name in before)
    assert f"{TEXTS - done} rows embedded" in output and f"{done} of {TEXTS} were already" in output
    assert all((out / name).read_bytes() == data for name, data in before.items()), "finished parts were rewritten"
    assert not list(out.glob(".*.tmp"))
    ids = pq.read_table(out)["id"].to_pylist()
    assert len(ids) == len(set(ids)) == TEXTS and set(ids) == {row["id"] for row in corpus_rows()}


@pytest.mark.timeout(300)
def test_ray_with_two_workers_gives_the_same_ids_and_vectors(exports, corpus, local, tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'prensa[distributed]')")
    from prensa.corpus.ray_runner import run_on_ray

    out = tmp_path / "out"
    job = Job(corpus, out, outputs="dense,sparse", rows_per_part=1000)

    def run() -> int:
        return run_on_ray(job, BackendSpec(export_dir=exports["bge-m3"]), "local", workers=2, cpus_per_worker=1,
                          console=Console(stderr=True)).written

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert run() == TEXTS
        assert_same_vectors(read(out), read(local))
        lost = sorted(out.glob("*.parquet"))[0]  # as if the worker writing it had died
        rows = pq.read_metadata(lost).num_rows
        lost.write_bytes(lost.read_bytes()[: lost.stat().st_size // 2])
        assert run() == rows
    finally:
        ray.shutdown()
    assert_same_vectors(read(out), read(local))


def test_refuses_duplicate_ids_missing_columns_and_a_changed_run(exports, tmp_path):
    model = ("--export", exports["bge-m3"])
    rows = [{"id": i % 7, "text": f"text {i}"} for i in range(10)]
    output = embed(write_jsonl(tmp_path / "dup.jsonl", rows), tmp_path / "a", *model, code=2)
    assert "3 ids occur more than once" in output and "0 x2" in output
    output = embed(write_jsonl(tmp_path / "col.jsonl", [{"id": 1, "body": "x"}]), tmp_path / "b", *model, code=2)
    assert "no column 'text'" in output
    good = write_jsonl(tmp_path / "good.jsonl", [{"id": i, "text": f"text {i}"} for i in range(10)])
    assert "10 rows embedded (dense)" in embed(good, tmp_path / "c", *model, "--outputs", "dense")
    assert pq.read_table(tmp_path / "c")["id"].type == pa.int64()
    assert "different outputs" in embed(good, tmp_path / "c", *model, "--outputs", "sparse", code=2)
    assert "offers outputs dense, sparse, colbert" in embed(good, tmp_path / "d", *model, "--outputs", "logits", code=2)
    assert "needs --model" in embed(good, tmp_path / "e", code=2)


def test_ids_and_texts_come_back_exactly_as_written(exports, tmp_path):
    """JSON strings that look like dates stay the strings they are: pyarrow would read them as
    timestamps, and "2024-01-01" would then equal "2024-01-01T00:00:00"."""
    rows = [{"id": "2024-01-01", "text": "2024-01-02"}, {"id": "2024-01-01T00:00:00", "text": "2024-01-03"},
            {"id": "2024-01-02", "text": "2024-01-01 10:00"}, {"id": "2024-01-01 00:00:01", "text": "2024-01-04"}]
    out = tmp_path / "out"
    assert "4 rows embedded" in embed(write_jsonl(tmp_path / "dates.jsonl", rows), out, "--export",
                                      exports["bge-m3"], "--outputs", "dense")
    table = read(out)
    assert table["id"].type == pa.string()
    assert sorted(table["id"].to_pylist()) == sorted(row["id"] for row in rows)


def test_broken_input_is_named_by_file_and_line(exports, tmp_path):
    """Past pyarrow's first block (about 1 MB here) its errors count rows from the block and name no
    file; the refusal names both, before any row is embedded."""
    model = ("--export", exports["bge-m3"], "--outputs", "dense")
    first = [{"id": f"doc-{i}", "text": "x" * 60} for i in range(20_000)]
    broken = {"json": '{"id": "doc-last", "text": \n', "type": '{"id": "doc-last", "text": 5}\n'}
    for kind, line in broken.items():
        path = tmp_path / f"{kind}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in first) + line)
        output = embed(path, tmp_path / f"out-{kind}", *model, code=2)
        assert f"{path}:20001:" in output, output
        assert not list((tmp_path / f"out-{kind}").glob("part-*"))
    assert "'text' is 5, where the input's first rows hold strings" in output
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text("".join(json.dumps({"id": i, "text": "t"}) + "\n" for i in range(20_000)) + '{"id": "x", "text": "t"}\n')
    assert f"{numbers}:20001: 'id' is \"x\", where the input's first rows hold integers" in embed(
        numbers, tmp_path / "out-numbers", *model, code=2)
    pq.write_table(pa.table({"id": [1, 2], "text": [3, 4]}), tmp_path / "ints.parquet")
    assert "'text' column holds int64, not text" in embed(tmp_path / "ints.parquet", tmp_path / "o", *model, code=2)


def test_an_empty_text_is_refused_as_the_server_refuses_it(exports, tmp_path):
    rows = [{"id": "a", "text": "some text"}, {"id": "b", "text": ""}]
    output = embed(write_jsonl(tmp_path / "empty.jsonl", rows), tmp_path / "out", "--export", exports["bge-m3"], code=2)
    assert "row 'b' has an empty 'text'" in output


def test_an_unreadable_run_record_is_named_and_records_are_written_whole(exports, tmp_path):
    """A record cut by a crash (the old in-place write) is refused by name; a record is now written to
    a temporary file and renamed, so a crash leaves the old one or the new one."""
    good = write_jsonl(tmp_path / "good.jsonl", [{"id": i, "text": f"text {i}"} for i in range(10)])
    out = tmp_path / "out"
    embed(good, out, "--export", exports["bge-m3"], "--outputs", "dense")
    assert json.loads((out / RECORD_FILE).read_text())["outputs"] == ["dense"]
    assert not list(out.glob(".*.tmp"))
    (out / RECORD_FILE).write_text("")
    output = embed(good, out, "--export", exports["bge-m3"], "--outputs", "dense", code=2)
    assert f"{out / RECORD_FILE} is not readable JSON" in output
