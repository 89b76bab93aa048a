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


def expired_job(root, custom_ids: str, answers: dict[int, int]):
    """A job over one line per id, `answers` (line -> status) stored, its window passed: the store,
    the job and its input file."""
    store = JobStore(root / "data")
    staged = store.staging()
    staged.write_text("\n".join(line(name) for name in custom_ids) + "\n")
    uploaded = store.add_file(staged, "batch", "in.jsonl")
    job = store.add_job(URL, uploaded.id, 60, "24h", None)
    store.move(job.id, states.IN_PROGRESS, total=len(custom_ids))
    for number, status in answers.items():
        custom_id = custom_ids[number - 1]
        store.answer(job.id, number, custom_id, status,
                     json.dumps({"custom_id": custom_id, "response": {"status_code": status}}))
    with sqlite3.connect(root / "data" / "jobs.sqlite") as db:
        db.execute("UPDATE jobs SET expires_at = 0 WHERE id = ?", (job.id,))
    return store, store.job(job.id), store.path(uploaded.id)


def runner(store: JobStore) -> JobRunner:
    async def nothing_served(name: str) -> None:
        return None

    return JobRunner(store, app=None, api_key=None, current=nothing_served)


def test_an_expired_job_writes_its_answers_and_each_line_never_run_as_an_error(tmp_path):
    store, job, path = expired_job(tmp_path, "abc", {1: 200, 2: 422})
    asyncio.run(runner(store)._finish(job, path, 3))
    ended = store.job(job.id)
    assert ended.status == states.EXPIRED
    output = store.path(ended.output_file_id).read_text().splitlines()
    errors = [json.loads(row) for row in store.path(ended.error_file_id).read_text().splitlines()]
    assert [json.loads(row)["custom_id"] for row in output] == ["a"]
    assert [row["custom_id"] for row in errors] == ["b", "c"]
    assert errors[1]["error"]["code"] == "batch_expired"
    assert not list((tmp_path / "data" / "files").glob(".*.tmp")), "no staged file is left behind"


def test_an_expired_job_whose_input_was_deleted_keeps_its_answers(tmp_path):
    store, job, path = expired_job(tmp_path, "ab", {1: 200})
    store.delete_file(job.input_file_id)
    asyncio.run(runner(store)._finish(job, path, 2))
    ended = store.job(job.id)
    assert ended.status == states.EXPIRED and ended.error_file_id is None
    assert [json.loads(row)["custom_id"] for row in store.path(ended.output_file_id).read_text().splitlines()] == ["a"]
    assert not list((tmp_path / "data" / "files").glob(".*.tmp"))


def test_a_line_that_breaks_the_runner_stops_the_lines_beside_it(tmp_path):
    """A worker that raises (here the app itself fails) ends the job's run, and the lines the other
    workers hold are cancelled, not left answering for a job another gateway may take over."""
    store = JobStore(tmp_path / "data")
    staged = store.staging()
    staged.write_text("\n".join(line(f"id{i}", body={"input": f"id{i}"}) for i in range(40)) + "\n")
    job = store.add_job(URL, store.add_file(staged, "batch", "in.jsonl").id, 60, "24h", None)
    finished: list[int] = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        request = json.loads((await receive())["body"])
        if request["input"] == "id3":
            raise RuntimeError("the app broke")
        await asyncio.sleep(0.5)  # the others are still computing when it breaks
        finished.append(1)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})

    async def scenario():
        runner = JobRunner(store, app=app, api_key=None, current=lambda name: asyncio.sleep(0))
        with pytest.raises((RuntimeError, ExceptionGroup)):
            await runner.run(store.job(job.id))
        await asyncio.sleep(1.0)  # long enough for any line still running to finish

    asyncio.run(scenario())
    assert finished == [] and store.answered(job.id) == set()
