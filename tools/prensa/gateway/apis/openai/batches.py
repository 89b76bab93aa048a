"""OpenAI's Files and Batch APIs over the gateway's job store (`gateway.jobs`): a JSONL file of
requests uploaded, a batch created on it, polled, cancelled, and its output and error files read
back, as the openai SDK's `files` and `batches` do. Errors come in OpenAI's own error object.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field

from prensa.gateway.apis.errors import VLLM_ERRORS
from prensa.gateway.errors import ErrorKind, GatewayError
from prensa.gateway.jobs import store as states
from prensa.gateway.jobs.runner import BATCH_PATHS
from prensa.gateway.jobs.store import Job, JobStore, StoredFile

router = APIRouter(responses=VLLM_ERRORS, tags=["OpenAI batches"])

FILES_PATH = "/v1/files"
WINDOWS = {"24h": 24 * 3600}  # OpenAI's one completion window
PURPOSES = ("batch", "batch_output")
NO_STORE = (
    "the Files and Batch APIs keep their jobs in a data directory: start the gateway with "
    "--data-dir (PRENSA_DATA_DIR)"
)


class BatchCreate(BaseModel):
    input_file_id: str
    endpoint: str = Field(description=f"Where every line posts: one of {', '.join(BATCH_PATHS)}.")
    completion_window: Literal["24h"] = "24h"
    metadata: dict[str, str] | None = None


def jobs_of(request: Request) -> JobStore:
    jobs: JobStore | None = getattr(request.app.state, "jobs", None)
    if jobs is None:
        raise GatewayError(ErrorKind.NOT_FOUND, NO_STORE)
    return jobs


def file_object(stored: StoredFile) -> dict[str, Any]:
    return {
        "id": stored.id,
        "object": "file",
        "bytes": stored.bytes,
        "created_at": stored.created_at,
        "filename": stored.filename,
        "purpose": stored.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def batch_object(job: Job) -> dict[str, Any]:
    stamps = {
        f"{status}_at": job.stamps.get(f"{status}_at")
        for status in (
            states.IN_PROGRESS,
            states.FINALIZING,
            states.COMPLETED,
            states.FAILED,
            states.EXPIRED,
            states.CANCELLING,
            states.CANCELLED,
        )
    }
    return {
        "id": job.id,
        "object": "batch",
        "endpoint": job.endpoint,
        "errors": job.errors,
        "input_file_id": job.input_file_id,
        "completion_window": job.completion_window,
        "status": job.status,
        "output_file_id": job.output_file_id,
        "error_file_id": job.error_file_id,
        "created_at": job.created_at,
        "expires_at": job.expires_at,
        **stamps,
        "request_counts": {"total": job.total, "completed": job.completed, "failed": job.failed},
        "metadata": job.metadata,
        # the model versions its lines are answered by, as pinned at each name's first line
        "model": ", ".join(sorted(set(job.models.values()))) or None,
    }


def listed(objects: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """OpenAI's cursor page: the objects after the one named `after`, at most `limit`."""
    ids = [one["id"] for one in objects]
    start = ids.index(after) + 1 if after in ids else 0
    page = objects[start : start + limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(objects),
    }


def _stored_file(jobs: JobStore, file_id: str) -> StoredFile:
    stored = jobs.file(file_id)
    if stored is None:
        raise GatewayError(ErrorKind.NOT_FOUND, f"No such File object: {file_id}")
    return stored


def _job(jobs: JobStore, batch_id: str) -> Job:
    job = jobs.job(batch_id)
    if job is None:
        raise GatewayError(ErrorKind.NOT_FOUND, f"No such Batch object: {batch_id}")
    return job


def _keep(jobs: JobStore, upload: UploadFile) -> Any:
    """The upload copied beside the files (it arrives spooled to a temporary file), flushed to disk."""
    staged = jobs.staging()
    with staged.open("wb") as out:
        shutil.copyfileobj(upload.file, out, 1 << 20)
        out.flush()
        os.fsync(out.fileno())
    return staged


@router.post(FILES_PATH, summary="Upload a file (a batch's JSONL requests)")
async def create_file(
    request: Request, file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()]
) -> JSONResponse:
    jobs = jobs_of(request)
    if purpose != "batch":
        raise GatewayError(
            ErrorKind.VALIDATION,
            f"purpose {purpose!r}: prensa keeps files for batches only ('batch')",
        )
    staged = await asyncio.to_thread(_keep, jobs, file)
    stored = await asyncio.to_thread(
        jobs.add_file, staged, purpose, file.filename or "upload.jsonl"
    )
    return JSONResponse(file_object(stored))


@router.get(FILES_PATH, summary="The files kept")
async def list_files(
    request: Request, after: str | None = None, limit: int = 10000
) -> JSONResponse:
    jobs = jobs_of(request)
    stored = await asyncio.to_thread(jobs.files)
    return JSONResponse(listed([file_object(one) for one in stored], after, limit))


@router.get(FILES_PATH + "/{file_id}", summary="One file")
async def retrieve_file(request: Request, file_id: str) -> JSONResponse:
    return JSONResponse(
        file_object(await asyncio.to_thread(_stored_file, jobs_of(request), file_id))
    )


@router.get(FILES_PATH + "/{file_id}/content", summary="A file's content")
async def file_content(request: Request, file_id: str) -> FileResponse:
    jobs = jobs_of(request)
    stored = await asyncio.to_thread(_stored_file, jobs, file_id)
    return FileResponse(
        jobs.path(stored.id), media_type="application/octet-stream", filename=stored.filename
    )


@router.delete(FILES_PATH + "/{file_id}", summary="Delete a file")
async def delete_file(request: Request, file_id: str) -> JSONResponse:
    if not await asyncio.to_thread(jobs_of(request).delete_file, file_id):
        raise GatewayError(ErrorKind.NOT_FOUND, f"No such File object: {file_id}")
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


@router.post(
    "/v1/batches", summary="Create a batch: every line of a file run as the same request online"
)
async def create_batch(request: Request, body: BatchCreate) -> JSONResponse:
    jobs = jobs_of(request)
    if body.endpoint not in BATCH_PATHS:
        raise GatewayError(
            ErrorKind.VALIDATION,
            f"endpoint {body.endpoint!r}: a batch posts to one of {', '.join(BATCH_PATHS)}",
        )
    await asyncio.to_thread(_stored_file, jobs, body.input_file_id)
    job = await asyncio.to_thread(
        jobs.add_job,
        body.endpoint,
        body.input_file_id,
        WINDOWS[body.completion_window],
        body.completion_window,
        body.metadata,
    )
    return JSONResponse(batch_object(job))


@router.get("/v1/batches", summary="The batches, newest first")
async def list_batches(request: Request, after: str | None = None, limit: int = 20) -> JSONResponse:
    jobs = jobs_of(request)
    return JSONResponse(
        listed([batch_object(job) for job in await asyncio.to_thread(jobs.jobs)], after, limit)
    )


@router.get("/v1/batches/{batch_id}", summary="One batch, with its progress")
async def retrieve_batch(request: Request, batch_id: str) -> JSONResponse:
    return JSONResponse(batch_object(await asyncio.to_thread(_job, jobs_of(request), batch_id)))


@router.post("/v1/batches/{batch_id}/cancel", summary="Cancel a batch; what was answered is kept")
async def cancel_batch(request: Request, batch_id: str) -> JSONResponse:
    jobs = jobs_of(request)
    job = await asyncio.to_thread(_job, jobs, batch_id)
    if job.status in states.OPEN and job.status != states.CANCELLING:
        await asyncio.to_thread(jobs.move, batch_id, states.CANCELLING)
    elif job.status not in states.OPEN:
        raise GatewayError(
            ErrorKind.VALIDATION,
            f"batch {batch_id} is {job.status}: only an open batch can be cancelled",
        )
    return JSONResponse(batch_object(await asyncio.to_thread(_job, jobs, batch_id)))
