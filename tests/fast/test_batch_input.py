"""A batch's input file is checked and read line by line: OpenAI's checks, each error on its line,
and memory that does not grow with the file (its bodies are never all held at once)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tracemalloc

import pytest

from prensa.gateway.jobs import store as states
from prensa.gateway.jobs.runner import MAX_ERRORS, InvalidInput, JobRunner, check_lines, read_lines
from prensa.gateway.jobs.store import JobStore

URL = "/v1/embeddings"


def line(custom_id: str, **changes) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": URL, "body": {"input": "x"}, **changes})


def test_lines_are_checked_and_read_in_order_with_their_numbers(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(line("a") + "\n\n" + line("b") + "\n")
    assert check_lines(path, URL) == 2
    assert [(one.number, one.custom_id) for one in read_lines(path, URL)] == [(1, "a"), (3, "b")]


def test_each_refused_line_is_named_by_its_number(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([line("a"), "not json", line("a"), line("c", method="GET"), line("d", url="/embed")]))
    with pytest.raises(InvalidInput) as refused:
        check_lines(path, URL)
    assert [error["line"] for error in refused.value.errors] == [2, 3, 4, 5]
    many = tmp_path / "many.jsonl"
    many.write_text("\n".join("[]" for _ in range(MAX_ERRORS + 50)))
    with pytest.raises(InvalidInput) as refused:
        check_lines(many, URL)
    assert len(refused.value.errors) == MAX_ERRORS


def test_a_large_input_is_read_without_holding_its_bodies(tmp_path):
    path = tmp_path / "large.jsonl"
    body = "word " * 200  # 1 KB a line
    with path.open("w") as out:
        for i in range(20_000):
            out.write(json.dumps({"custom_id": f"id-{i}", "method": "POST", "url": URL, "body": {"input": body}}) + "\n")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        assert check_lines(path, URL) == 20_000
        assert sum(1 for _ in read_lines(path, URL)) == 20_000
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size / 4, f"peak {peak} bytes for a {size}-byte file"


def test_an_expired_job_writes_its_answers_and_each_line_never_run_as_an_error(tmp_path):
    store = JobStore(tmp_path / "data")
    staged = store.staging()
    staged.write_text("\n".join(line(name) for name in "abc") + "\n")
    uploaded = store.add_file(staged, "batch", "in.jsonl")
    job = store.add_job(URL, uploaded.id, 60, "24h", None)
    store.move(job.id, states.IN_PROGRESS, total=3)
    store.answer(job.id, 1, "a", 200, json.dumps({"custom_id": "a", "response": {"status_code": 200}}))
    store.answer(job.id, 2, "b", 422, json.dumps({"custom_id": "b", "response": {"status_code": 422}}))
    with sqlite3.connect(tmp_path / "data" / "jobs.sqlite") as db:
        db.execute("UPDATE jobs SET expires_at = 0 WHERE id = ?", (job.id,))
    runner = JobRunner(store, app=None, api_key=None)
    asyncio.run(runner._finish(store.job(job.id), store.path(uploaded.id), 3))
    ended = store.job(job.id)
    assert ended.status == states.EXPIRED
    output = store.path(ended.output_file_id).read_text().splitlines()
    errors = [json.loads(row) for row in store.path(ended.error_file_id).read_text().splitlines()]
    assert [json.loads(row)["custom_id"] for row in output] == ["a"]
    assert [row["custom_id"] for row in errors] == ["b", "c"]
    assert errors[1]["error"]["code"] == "batch_expired"
    assert not list((tmp_path / "data" / "files").glob(".*.tmp")), "no staged file is left behind"


def test_an_expired_job_whose_input_was_deleted_keeps_its_answers(tmp_path):
    store = JobStore(tmp_path / "data")
    staged = store.staging()
    staged.write_text("\n".join(line(name) for name in "ab") + "\n")
    uploaded = store.add_file(staged, "batch", "in.jsonl")
    job = store.add_job(URL, uploaded.id, 60, "24h", None)
    store.move(job.id, states.IN_PROGRESS, total=2)
    store.answer(job.id, 1, "a", 200, json.dumps({"custom_id": "a", "response": {"status_code": 200}}))
    with sqlite3.connect(tmp_path / "data" / "jobs.sqlite") as db:
        db.execute("UPDATE jobs SET expires_at = 0 WHERE id = ?", (job.id,))
    path = store.path(uploaded.id)
    store.delete_file(uploaded.id)
    asyncio.run(JobRunner(store, app=None, api_key=None)._finish(store.job(job.id), path, 2))
    ended = store.job(job.id)
    assert ended.status == states.EXPIRED and ended.error_file_id is None
    assert [json.loads(row)["custom_id"] for row in store.path(ended.output_file_id).read_text().splitlines()] == ["a"]
    assert not list((tmp_path / "data" / "files").glob(".*.tmp"))
