"""`prensa embed-corpus` through Triton rides out a Triton killed and started again mid-job (as
`prensa serve` restarts it): the job waits for the model, finishes with exit 0, and every id is
written once with the vectors an in-process run of the same export gives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from prensa.triton.repo import ServingOptions
from tests.corpus.test_embed_corpus import (
    assert_same_vectors,
    corpus_rows,
    embed,
    read,
    write_jsonl,
)
from tests.reliability.conftest import build_repo, own_triton

ROWS = 3000
ROWS_PER_PART = 100


@pytest.mark.triton
@pytest.mark.timeout(600)
def test_a_job_rides_out_a_triton_killed_and_started_again(exports, tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", corpus_rows()[:ROWS])
    repo = build_repo(exports, ["bge-m3"], tmp_path / "repo", ServingOptions())
    out = tmp_path / "out"
    with own_triton(repo, tmp_path / "tritonserver.log") as triton:
        arguments = [corpus, out, "--triton-url", triton.grpc_url, "--model", "bge-m3", "--outputs", "dense,sparse",
                     "--rows-per-part", ROWS_PER_PART, "--heal-wait", 300]
        job = subprocess.Popen([str(Path(sys.executable).parent / "prensa"), "embed-corpus", *map(str, arguments)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while len(list(out.glob("part-*.parquet"))) < 2:
            assert job.poll() is None, job.communicate()[0]
            assert time.monotonic() < deadline, "no parts written in time"
            time.sleep(0.05)
        os.killpg(triton.process.pid, signal.SIGKILL)  # Triton and its stubs, with requests in flight
        triton.process.wait()
        parts_when_killed = len(list(out.glob("part-*.parquet")))
        time.sleep(2)  # the job meets a server that is gone
        assert job.poll() is None, f"the job ended when Triton died:\n{job.communicate()[0]}"
        triton.start()
        triton.wait_ready()
        output, _ = job.communicate(timeout=300)
    assert job.returncode == 0, output
    assert parts_when_killed < ROWS // ROWS_PER_PART, "Triton was killed after the job had finished"
    assert f"{ROWS} rows embedded" in " ".join(output.split())
    ids = pq.read_table(out)["id"].to_pylist()
    assert len(ids) == len(set(ids)) == ROWS
    local = tmp_path / "local"
    embed(corpus, local, "--export", exports["bge-m3"], "--outputs", "dense,sparse")
    assert_same_vectors(read(out), read(local))
