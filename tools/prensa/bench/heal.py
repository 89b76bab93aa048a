"""Heal time under load: how long the embedder answers 503 after its encoder stub is killed
(`prensa loadtest heal`).

A prensa of its own (as `prensa loadtest soak` starts it), clients over every kind of request the
models serve, and SIGKILLs of the Python-backend stub of the embedder's encode stage, some seconds
apart. Per kill: the requests answered after it and the slowest of those in flight at the kill;
if any failed, healed (from the kill to the first request, sent after the last failure, that was
answered 200) and the 503s meanwhile; how long the stage watch took to unload and load the stage
(its own log line); and what the other models answered meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from prensa.bench.soak import (
    Kind,
    NotServing,
    answers_dense,
    first_model,
    requests_for,
    serving_prensa,
    warm_up,
)
from prensa.stages import stage_model_name

RELOADED = re.compile(
    r"(?P<stage>\S+) is serving again, (?P<total>[\d.]+) s after its stub was found dead "
    r"\(unload (?P<unload>[\d.]+) s, load (?P<load>[\d.]+) s\)"
)


@dataclass
class Outcomes:
    """(sent, answered, kind, status, retry_after) of every request, in the order they were answered."""

    rows: list[tuple[float, float, str, int | str, str | None]] = field(default_factory=list)


def stub_of(root: int, stage: str) -> psutil.Process:
    """The live Python-backend stub serving `stage` among `root`'s descendants (Triton does not reap
    a stub that died: its zombie is passed over)."""
    for process in psutil.Process(root).children(recursive=True):
        try:
            if (
                f"/{stage}/1/model.py" in " ".join(process.cmdline())
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                return process
        except psutil.Error:
            continue
    raise LookupError(f"no stub serves {stage}")


async def drive(
    url: str,
    kinds: list[Kind],
    until: float,
    concurrency: int,
    outcomes: Outcomes,
    honour_retry_after: bool,
) -> None:
    """`concurrency` clients send the kinds in turn until `until`, each outcome recorded."""
    cycle = itertools.cycle(kinds)

    async def client_loop(index: int) -> None:
        rng = random.Random(index)
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            while time.monotonic() < until:
                kind, route, body = next(cycle)
                sent = time.monotonic()
                retry_after = None
                try:
                    response = await client.post(route, json=body(rng, False))
                    status: int | str = response.status_code
                    retry_after = response.headers.get("retry-after")
                except httpx.TransportError as exc:
                    status = type(exc).__name__
                outcomes.rows.append((sent, time.monotonic(), kind, status, retry_after))
                if honour_retry_after and retry_after:
                    await asyncio.sleep(float(retry_after))

    await asyncio.gather(*(client_loop(i) for i in range(concurrency)))


def report(
    kill_at: float, until: float, killed_kind: str, outcomes: Outcomes, line: re.Match[str] | None
) -> list[str]:
    """What one kill did, as lines: to the killed kind's requests, and to the other kinds'."""
    lines: list[str] = []
    # answered after the kill
    window = [row for row in outcomes.rows if kill_at <= row[1] and row[0] < until]
    own = [row for row in window if row[2] == killed_kind]
    failed = [sent for sent, _, _, status, _ in own if status != 200]
    slowest = max((done - sent for sent, done, _, _, _ in own if sent <= kill_at), default=0.0)
    lines.append(
        f"  {killed_kind}: {len(own)} requests answered, the slowest of those in flight at the kill in "
        f"{slowest:.2f} s"
    )
    if not failed:
        lines.append("  none failed")
    else:
        # sent after the kill too: a request in flight at the kill may fail after one sent later
        # (but before the kill) succeeded, which says nothing of the heal
        since = max(max(failed), kill_at)
        after = [sent for sent, _, _, status, _ in own if status == 200 and sent > since]
        healed = f"{min(after) - kill_at:.2f} s" if after else "not healed"
        hints = Counter(retry for _, _, _, status, retry in own if status == 503)
        statuses = dict(Counter(status for _, _, _, status, _ in own if status != 200))
        lines.append(
            f"  healed in {healed}; {len(failed)} requests failed meanwhile ({statuses}, "
            f"Retry-After {dict(hints)})"
        )
    if line:
        total, unload, load = float(line["total"]), float(line["unload"]), float(line["load"])
        lines.append(
            f"  stage watch: {line['stage']} unloaded in {unload:.2f} s, loaded in {load:.2f} s "
            f"({total:.2f} s from finding the dead stub)"
        )
    for kind in sorted({row[2] for row in window} - {killed_kind}):
        lines.append(
            f"  {kind}: {dict(Counter(status for _, _, k, status, _ in window if k == kind))}"
        )
    return lines


@dataclass(frozen=True)
class HealRun:
    """What `prensa loadtest heal` runs: `kills` stub kills `gap_s` apart under `concurrency` clients."""

    work: Path
    models: tuple[str, ...] = ()
    concurrency: int = 16
    kills: int = 3
    gap_s: float = 20.0
    kinds: tuple[str, ...] = ()  # request kinds the clients send; () = all the models serve
    honour_retry_after: bool = False
    up_flags: tuple[str, ...] = ()


def run_heal(run: HealRun, say: Callable[[str], None]) -> list[str]:
    """Serve, warm up, load while killing the embedder's encode stub; the report, one block per kill."""
    log = run.work / "heal.log"
    with serving_prensa(run.work, run.models, log, say, run.up_flags) as (process, url):
        info = httpx.get(f"{url}/info").json()
        kinds = [kind for kind in requests_for(info) if not run.kinds or kind[0] in run.kinds]
        if not kinds:
            raise NotServing(f"the served models answer none of {', '.join(run.kinds)}")
        killed_kind, _, _ = kinds[0]
        embedder = first_model(info, answers_dense)
        if embedder is None:
            raise NotServing("no served model answers dense embeddings")
        asyncio.run(warm_up(url, kinds, run.concurrency))
        outcomes = Outcomes()
        start = time.monotonic()
        until = start + run.gap_s * (run.kills + 0.5)
        kills: list[float] = []

        async def kill_later() -> None:
            for n in range(run.kills):
                await asyncio.sleep(start + run.gap_s * (n + 0.5) - time.monotonic())
                kills.append(time.monotonic())
                stub_of(process.pid, stage_model_name(embedder, "encode")).send_signal(
                    signal.SIGKILL
                )

        async def load_and_kill() -> None:
            await asyncio.gather(
                drive(url, kinds, until, run.concurrency, outcomes, run.honour_retry_after),
                kill_later(),
            )

        say(
            f"{run.concurrency} clients over {', '.join(k for k, _, _ in kinds)}; killing "
            f"{stage_model_name(embedder, 'encode')}'s stub "
            f"{run.kills} times, {run.gap_s:g} s apart"
        )
        asyncio.run(load_and_kill())
    reloads = list(RELOADED.finditer(log.read_text(errors="replace")))
    lines = []
    for n, kill_at in enumerate(kills):  # requests sent just before the next kill fail for that one
        lines.append(f"kill {n + 1}:")
        lines += report(
            kill_at,
            kill_at + run.gap_s * 0.75,
            killed_kind,
            outcomes,
            reloads[n] if n < len(reloads) else None,
        )
    return lines
