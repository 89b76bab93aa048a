"""Heal time under load: how long the embedder answers 503 after its encoder stub is killed.

Starts `prensa up` (the offline default models unless `--model` names others; exports are kept in
`--work` and reused, as `tools/soak.py` does), drives `--concurrency` clients over every kind of
request the models serve, and `--kills` times SIGKILLs the Python-backend stub of the embedder's
encode stage, `--gap` seconds apart. Per kill it prints: the requests answered after the kill
and the slowest of those in flight at the kill; if any failed, healed (from the kill to the
first request, sent after the last failure, that was answered 200) and the 503s meanwhile; how
long the stage watch took to unload and load the stage (its own log line); and what the other
models answered meanwhile. Clients honour `Retry-After` with
`--honour-retry-after`, as a well-behaved client (the openai SDK, tenacity) does.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import re
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from soak import Body, requests_for, start_prensa, stop, wait_healthy, warm_up

RELOADED = re.compile(r"(?P<stage>\S+) is serving again, (?P<total>[\d.]+) s after its stub was found dead "
                      r"\(unload (?P<unload>[\d.]+) s, load (?P<load>[\d.]+) s\)")


@dataclass
class Outcomes:
    """(sent, answered, kind, status, retry_after) of every request, in the order they were answered."""

    rows: list[tuple[float, float, str, int | str, str | None]] = field(default_factory=list)


def stub_of(root: int, stage: str) -> psutil.Process:
    """The live Python-backend stub serving `stage` among `root`'s descendants (Triton does not reap
    a stub that died: its zombie is passed over)."""
    for process in psutil.Process(root).children(recursive=True):
        try:
            if f"/{stage}/1/model.py" in " ".join(process.cmdline()) and process.status() != psutil.STATUS_ZOMBIE:
                return process
        except psutil.Error:
            continue
    raise LookupError(f"no stub serves {stage}")


async def drive(url: str, kinds: list[tuple[str, str, Body]], until: float, concurrency: int,
                outcomes: Outcomes, honour_retry_after: bool) -> None:
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


def report(kill_at: float, until: float, killed_kind: str, outcomes: Outcomes, line: re.Match[str] | None) -> None:
    window = [row for row in outcomes.rows if kill_at <= row[1] and row[0] < until]  # answered after the kill
    own = [row for row in window if row[2] == killed_kind]
    failed = [sent for sent, _, _, status, _ in own if status != 200]
    slowest = max((done - sent for sent, done, _, _, _ in own if sent <= kill_at), default=0.0)
    print(f"  {killed_kind}: {len(own)} requests answered, the slowest of those in flight at the kill in {slowest:.2f} s")
    if not failed:
        print("  none failed")
    else:
        after = [sent for sent, _, _, status, _ in own if status == 200 and sent > max(failed)]
        healed = f"{min(after) - kill_at:.2f} s" if after else "not healed"
        hints = Counter(retry for _, _, _, status, retry in own if status == 503)
        print(f"  healed in {healed}; {len(failed)} requests failed meanwhile "
              f"({dict(Counter(status for _, _, _, status, _ in own if status != 200))}, Retry-After {dict(hints)})")
    if line:
        total, unload, load = float(line["total"]), float(line["unload"]), float(line["load"])
        print(f"  stage watch: {line['stage']} unloaded in {unload:.2f} s, loaded in {load:.2f} s "
              f"({total:.2f} s from finding the dead stub)")
    for kind in sorted({row[2] for row in window} - {killed_kind}):
        print(f"  {kind}: {dict(Counter(status for _, _, k, status, _ in window if k == kind))}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("soak-run"), help="exports, repository and log")
    parser.add_argument("--model", action="append", help="NAME=SOURCE for `prensa up` (default: its offline set)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--kills", type=int, default=3, help="stub kills, one after another (default 3)")
    parser.add_argument("--gap", type=float, default=20.0, help="seconds between kills (default 20)")
    parser.add_argument("--kind", action="append", choices=["embeddings", "sparse", "rerank"],
                        help="request kinds the clients send (default: all the models serve)")
    parser.add_argument("--honour-retry-after", action="store_true", help="clients wait as Retry-After says")
    parser.add_argument("extra", nargs="*", help="more `prensa up` flags, after --")
    args = parser.parse_args()

    log = args.work / "heal.log"
    process, url = start_prensa(args.work, args.model, log, tuple(args.extra))
    try:
        print(f"starting prensa (log: {log}) ...", flush=True)
        if not wait_healthy(url, process, timeout_s=1800):
            print(f"prensa did not become healthy; see {log}")
            return 2
        info = httpx.get(f"{url}/info").json()
        kinds = [kind for kind in requests_for(info) if not args.kind or kind[0] in args.kind]
        killed_kind, _, _ = kinds[0]
        embedder = next(m["served_model_name"] for m in info["models"] if m["task"] in ("embed", "m3"))
        asyncio.run(warm_up(url, kinds, args.concurrency))
        outcomes = Outcomes()
        start = time.monotonic()
        until = start + args.gap * (args.kills + 0.5)
        kills: list[float] = []

        async def kill_later() -> None:
            for n in range(args.kills):
                await asyncio.sleep(start + args.gap * (n + 0.5) - time.monotonic())
                kills.append(time.monotonic())
                stub_of(process.pid, f"{embedder}_encode").send_signal(signal.SIGKILL)

        async def run() -> None:
            await asyncio.gather(drive(url, kinds, until, args.concurrency, outcomes, args.honour_retry_after),
                                 kill_later())

        print(f"{args.concurrency} clients over {', '.join(k for k, _, _ in kinds)}; "
              f"killing {embedder}_encode's stub {args.kills} times, {args.gap:g} s apart", flush=True)
        asyncio.run(run())
    finally:
        stop(process)
    lines = list(RELOADED.finditer(log.read_text(errors="replace")))
    for n, kill_at in enumerate(kills):  # requests sent just before the next kill fail for that one
        print(f"kill {n + 1}:")
        report(kill_at, kill_at + args.gap * 0.75, killed_kind, outcomes, lines[n] if n < len(lines) else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
