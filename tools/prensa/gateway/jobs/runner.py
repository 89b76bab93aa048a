"""The gateway's bulk worker: it takes open jobs from the store (one gateway per job, by lease) and
runs each line through the gateway's own app, so a line is answered exactly as the same request
sent online would be (same routes, checks, limits and errors), then writes the output and error
files OpenAI's batch objects point to. A line that names its model goes to the version the name
reached at the job's first line of that name (`JobStore.pin`): a promotion or rollback meanwhile
does not mix two versions' vectors in one job, and a pinned version removed meanwhile fails the
lines left, by name. A line that names no model is picked as the same request online would be
(the default model, or the first that serves its route), by whatever version that reaches then.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
import orjson
from starlette.types import ASGIApp

from prensa.gateway.core.request_context import PRIORITY_HEADER, Priority
from prensa.gateway.errors import GatewayError
from prensa.gateway.jobs import store as states
from prensa.gateway.jobs.store import Job, JobStore, new_id

log = logging.getLogger("prensa.gateway")

POLL_S = 0.5  # how often an idle worker looks for a job
RETRY_S = 5.0  # how long a job whose run failed waits before it is taken up again
WAITING = (429, 503)  # a line the server cannot take now: sent again, first after WAIT_S
BACKEND_FAILED, BACKEND_TRIES = 424, 5  # a Triton call failed: sent at most this many times
WAIT_S, WAIT_MAX_S = 0.5, 10.0
STOP_CHECK_S = 1.0  # how stale a running job's cancelled-or-expired state may be
LINES_IN_FLIGHT = 8  # a job's lines sent to the app at once
MAX_LINES = 50_000  # OpenAI's limit per batch
MAX_ERRORS = 100  # a refused input file's errors reported, the first ones
BATCH_PATHS = (  # the routes a line may post to: every embedding and relevance route
    "/v1/embeddings",
    "/embeddings",
    "/v1/rerank",
    "/rerank",
    "/v2/rerank",
    "/v1/score",
    "/score",
    "/embed",
    "/embed_sparse",
    "/embed_all",
    "/embed_colbert",
    "/embed_m3",
    "/predict",
    "/classify",
    "/pooling",
    "/v1/embed",
    "/v2/embed",
    "/api/embed",
    "/v1/ranking",
)


@dataclass(frozen=True)
class Line:
    number: int  # from 1, as editors count
    custom_id: str
    url: str
    body: dict[str, Any]


class InvalidInput(ValueError):
    """An input file OpenAI would refuse at validation; `errors` are its error objects."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors[0]["message"])
        self.errors = errors


def check_lines(path: Path, endpoint: str) -> int:
    """How many requests the input file holds, each checked as OpenAI checks them before a job
    starts: JSON objects with a unique `custom_id`, `method` POST, `url` the job's endpoint and an
    object `body`. Read line by line: only the ids stay in memory, not the bodies."""
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in _raw_lines(path):
        problem = _line_problem(raw, endpoint, seen)
        if isinstance(problem, Line):
            seen.add(problem.custom_id)
        elif len(errors) < MAX_ERRORS:
            errors.append(input_error("invalid_request", problem, number))
    if not seen and not errors:
        errors.append(input_error("empty_file", "The input file has no requests"))
    if len(seen) > MAX_LINES:
        message = f"{len(seen)} requests; a batch takes at most {MAX_LINES}"
        errors.append(input_error("too_many_requests", message))
    if errors:
        raise InvalidInput(errors)
    return len(seen)


def read_lines(path: Path, endpoint: str) -> Iterator[Line]:
    """The input file's requests (checked before by `check_lines`), one at a time."""
    for number, raw in _raw_lines(path):
        line = _line_problem(raw, endpoint, set())
        if isinstance(line, Line):
            yield Line(number, line.custom_id, line.url, line.body)


def _raw_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The file's lines that are not blank, numbered from 1 as editors count."""
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, 1):
            if raw.strip():
                yield number, raw


def input_error(code: str, message: str, line: int | None = None) -> dict[str, Any]:
    """One of a failed batch's `errors`, as OpenAI's batch objects carry them."""
    return {"code": code, "message": message, "param": None, "line": line}


def line_id(job: Job, line: Line) -> str:
    """A line's id in the output and error files, the same however often the line runs."""
    return f"batch_req_{job.id.removeprefix('batch_')}_{line.number}"


def _line_problem(raw: bytes, endpoint: str, seen: set[str]) -> Line | str:
    try:
        request = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "The line is not JSON"
    if not isinstance(request, dict):
        return "The line is not a JSON object"
    custom_id, url, body = request.get("custom_id"), request.get("url"), request.get("body")
    if not isinstance(custom_id, str) or not custom_id:
        return "`custom_id` must be a non-empty string"
    if custom_id in seen:
        return f"`custom_id` {custom_id!r} is used by an earlier line; each must be unique"
    if request.get("method") != "POST":
        return "`method` must be POST"
    if url != endpoint:
        return f"`url` is {url!r}; every line of this batch posts to {endpoint!r}"
    if not isinstance(body, dict):
        return "`body` must be a JSON object"
    return Line(0, custom_id, url, body)


def output_line(job: Job, line: Line, status: int, request_id: str, body: Any) -> str:
    """One line of the output (or error) file, in OpenAI's shape."""
    response = {"status_code": status, "request_id": request_id, "body": body}
    return json.dumps(
        {
            "id": line_id(job, line),
            "custom_id": line.custom_id,
            "response": response,
            "error": None,
        }
    )


class JobRunner:
    """Runs open jobs of `store` through `app`, one at a time, while the gateway serves."""

    def __init__(
        self,
        store: JobStore,
        app: ASGIApp,
        api_key: str | None,
        current: Callable[[str], Awaitable[str | None]],
    ) -> None:
        """`current`: the version a model name reaches now, pinned (`name@N`), None when there is
        nothing to pin (`Registry.current`)."""
        self.store, self.holder, self.current = store, new_id("gateway"), current
        self._pins: dict[str, dict[str, str]] = {}  # job -> its pinned versions, as stored
        self._stop_checked: dict[str, tuple[float, bool]] = {}  # job -> (when read, stopping)
        # a job's lines are bulk work: online requests go before them (`Priority`)
        headers = {PRIORITY_HEADER: Priority.BULK.name.lower()}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://prensa-batch",
            headers=headers,
            timeout=None,
        )

    async def run_forever(self) -> None:
        try:
            while True:
                job = await asyncio.to_thread(self.store.claim, self.holder)
                if job is None:
                    await asyncio.sleep(POLL_S)
                    continue
                try:
                    await self._with_lease(job)
                except Exception:  # a job's fault stops the job, not the worker
                    log.exception("batch %s stopped; it is taken up again", job.id)
                    await asyncio.sleep(RETRY_S)
        finally:
            await self.client.aclose()

    async def _with_lease(self, job: Job) -> None:
        """`job` run while its lease is renewed; released when done, or when the gateway stops."""
        work = asyncio.ensure_future(self.run(job))
        try:
            while not work.done():
                await asyncio.wait({work}, timeout=states.LEASE_S / 3)
                renewed = work.done() or await asyncio.to_thread(
                    self.store.renew, job.id, self.holder
                )
                if not renewed:  # another gateway took it over: it answers the rest
                    log.warning("batch %s was taken over by another gateway", job.id)
                    return
            work.result()
        finally:
            work.cancel()
            with suppress(asyncio.CancelledError):
                await work
            await asyncio.to_thread(self.store.release, job.id, self.holder)

    async def run(self, job: Job) -> None:
        path = self.store.path(job.input_file_id)
        try:
            total = await asyncio.to_thread(check_lines, path, job.endpoint)
        except FileNotFoundError:
            gone = input_error("file_deleted", "The input file was deleted")
            errors = json.dumps({"object": "list", "data": [gone]})
            await asyncio.to_thread(self.store.move, job.id, states.FAILED, errors=errors)
            return
        except InvalidInput as invalid:
            errors = json.dumps({"object": "list", "data": invalid.errors})
            await asyncio.to_thread(self.store.move, job.id, states.FAILED, errors=errors)
            return
        if job.status == states.VALIDATING:
            await asyncio.to_thread(self.store.move, job.id, states.IN_PROGRESS, total=total)
        if job.status != states.CANCELLING:
            await self._answer(job, path)
        await self._finish(job, path, total)

    async def _answer(self, job: Job, path: Path) -> None:
        """Every line not answered yet, a few at a time, read from the file as they go; it stops
        early when the job is cancelled or expires."""
        done = await asyncio.to_thread(self.store.answered, job.id)
        pending = read_lines(path, job.endpoint)

        async def worker() -> None:
            for line in pending:  # the workers share it: one buffered line read at a time
                if line.number in done:
                    continue
                if await asyncio.to_thread(self._stopping, job.id):
                    return
                await self._answer_one(job, line)

        # a worker that fails stops its siblings: no line goes on being answered by a job that
        # stopped, and whose lease another gateway may take
        async with asyncio.TaskGroup() as workers:
            for _ in range(LINES_IN_FLIGHT):
                workers.create_task(worker())

    def _stopping(self, job_id: str) -> bool:
        """Whether the job was cancelled, expired or deleted: read from the store at most once a
        `STOP_CHECK_S`, not once per line."""
        checked_at, stopping = self._stop_checked.get(job_id, (0.0, False))
        if time.monotonic() - checked_at >= STOP_CHECK_S:
            current = self.store.job(job_id)
            stopping = (
                current is None
                or current.status == states.CANCELLING
                or time.time() > current.expires_at
            )
            self._stop_checked[job_id] = (time.monotonic(), stopping)
        return stopping

    async def _answer_one(self, job: Job, line: Line) -> None:
        """One line's answer stored. A line the server cannot take now (429, 503: busy, or Triton
        restarting) waits and goes again, as a client would, for as long as the job runs; one whose
        Triton call failed (424) goes again a few times, a dead Triton's way of failing."""
        pause, tries = WAIT_S, 0
        while True:
            response = await self.client.post(line.url, json=await self._pinned(job, line.body))
            tries += 1
            waits = response.status_code in WAITING or (
                response.status_code == BACKEND_FAILED and tries < BACKEND_TRIES
            )
            if not waits or await asyncio.to_thread(self._stopping, job.id):
                break
            await asyncio.sleep(pause)
            pause = min(pause * 2, WAIT_MAX_S)
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        request_id = response.headers.get("x-request-id", "")
        row = output_line(job, line, response.status_code, request_id, body)
        await asyncio.to_thread(
            self.store.answer, job.id, line.number, line.custom_id, response.status_code, row
        )

    async def _pinned(self, job: Job, body: Any) -> Any:
        """`body` naming the version its model name is pinned to for `job`, pinning it now when
        this is the name's first line (or nothing was served when it came). A body that names no
        model, or not as a string (refused by its route, as online), is sent as it is."""
        name = body.get("model") if isinstance(body, dict) else None
        if not name or not isinstance(name, str):
            return body
        pins = self._pins.setdefault(job.id, dict(job.models))
        if name not in pins:
            try:
                model = await self.current(name)
            except (
                GatewayError
            ):  # Triton not reachable yet: the line waits, and pins on its next try
                return body
            if model is None:
                return body
            pins[name] = await asyncio.to_thread(self.store.pin, job.id, name, model)
        return {**body, "model": pins[name]}

    async def _finish(self, job: Job, path: Path, total: int) -> None:
        """The output and error files, then the job's last status: completed, cancelled (a job
        cancelled keeps what was answered) or expired (what was not answered is an error line)."""
        current = await asyncio.to_thread(self.store.job, job.id)
        assert current is not None
        final = (
            states.CANCELLED
            if current.status == states.CANCELLING
            else states.EXPIRED
            if time.time() > current.expires_at and current.completed + current.failed < total
            else states.COMPLETED
        )
        if final == states.COMPLETED:
            await asyncio.to_thread(self.store.move, job.id, states.FINALIZING)
        output, errors = await asyncio.to_thread(
            self._write_results, job, path if final == states.EXPIRED else None
        )
        await asyncio.to_thread(
            self.store.move, job.id, final, output_file_id=output, error_file_id=errors
        )

    def _write_results(self, job: Job, expired_from: Path | None) -> tuple[str, str | None]:
        """The output file and the error file (None when no line failed), each whole or absent,
        streamed from the store in line order; with `expired_from`, the input's lines never
        answered are error lines too (none when the input was deleted meanwhile). A failure
        leaves no staged file behind."""
        output, errors = self.store.staging(), self.store.staging()
        try:
            with output.open("w") as ok, errors.open("w") as bad:
                failed = 0
                for row in self.store.answers(job.id):
                    if row["status_code"] < 400:
                        ok.write(row["body"] + "\n")
                    else:
                        bad.write(row["body"] + "\n")
                        failed += 1
                if expired_from is not None:
                    failed += self._write_expired(job, expired_from, bad)
                for out in (ok, bad):
                    out.flush()
                    os.fsync(out.fileno())
            output_id = self.store.add_file(output, "batch_output", f"{job.id}_output.jsonl").id
            if not failed:
                return output_id, None
            error_file = self.store.add_file(errors, "batch_output", f"{job.id}_error.jsonl")
            return output_id, error_file.id
        finally:  # added files were renamed away; what is left here was not added
            output.unlink(missing_ok=True)
            errors.unlink(missing_ok=True)

    def _write_expired(self, job: Job, path: Path, out: TextIO) -> int:
        """An error line for each input line never answered; how many."""
        answered = self.store.answered(job.id)
        count = 0
        try:
            for line in read_lines(path, job.endpoint):
                if line.number not in answered:
                    out.write(_expired_line(job, line) + "\n")
                    count += 1
        except FileNotFoundError:  # the input was deleted while the job ran
            log.warning("batch %s expired after its input file was deleted", job.id)
        return count


def _expired_line(job: Job, line: Line) -> str:
    return json.dumps(
        {
            "id": line_id(job, line),
            "custom_id": line.custom_id,
            "response": None,
            "error": {
                "code": "batch_expired",
                "message": "The batch expired before this request ran",
            },
        }
    )
