"""Start and stop the `tritonserver` binary shipped inside the nvidia-pytriton wheel.

The wheel carries Triton 2.51, the Python backend library and one backend stub per CPython
minor version. Triton expects the stub beside `libtriton_python.so`, so we assemble a small
backend directory under the user's cache once. The stub imports packages from the `python3`
first on PATH, hence the current interpreter's `bin/` goes first there.

Triton runs in its own session (a Ctrl-C reaches prensa, which decides how Triton stops), so it
would outlive a prensa killed with SIGKILL: the kernel's parent-death signal kills it then, and its
stubs, which watch their parent, follow within a second. A stub still loading its model does not,
and stubs killed along with Triton leave their shared-memory regions in /dev/shm: `leftovers`
clears both before a Triton starts and after one stops. Triton starts in explicit model-control
mode with every model loaded, so that one model can be reloaded (`prensa.triton.healing`). With a
cache size it also starts Triton's `local` response cache, whose library the wheel ships in
`caches/`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import cast

import psutil
import tritonclient.http as httpclient

from prensa.addresses import LOOPBACK, TRITON_GRPC_PORT, TRITON_HTTP_PORT, TRITON_METRICS_PORT
from prensa.triton import leftovers
from prensa.triton.tracing import TritonTracing

# Lines Triton logs as errors on every machine without a GPU.
CPU_NOISE = ("CudaDriverHelper", "NVML", "DCGM", "cuda", "CUDA")
CACHE_DIR = Path(os.environ.get("PRENSA_CACHE", Path.home() / ".cache" / "prensa"))
# prctl(2) option: the signal a process gets when the thread that forked it ends
PR_SET_PDEATHSIG = 1
LIBC = ctypes.CDLL(None, use_errno=True)
# Triton's local cache refuses to start on a few hundred bytes, and one that cannot hold a response
# logs an error per request; a size below this is a unit mistake (`--cache-size 512` meant MiB).
MIN_CACHE_BYTES = 1 << 20


def is_error_line(line: str) -> bool:
    """An error Triton logged (a model load failure, a stage's exception), not CPU-only noise."""
    return (
        (line.startswith("E") and line[1:5].isdigit()) or line.startswith("error:")
    ) and not any(noise in line for noise in CPU_NOISE)


class TritonStartError(RuntimeError):
    """Triton exited or never became ready; the message carries the end of its log."""


@dataclass(frozen=True)
class TritonPorts:
    http: int = TRITON_HTTP_PORT
    grpc: int = TRITON_GRPC_PORT
    metrics: int = TRITON_METRICS_PORT


@dataclass(frozen=True)
class TritonOptions:
    repo: Path
    _: KW_ONLY  # the rest by name
    host: str = LOOPBACK
    ports: TritonPorts = field(default_factory=TritonPorts)
    log_verbose: int = 0
    model_control_mode: str = "explicit"  # every model loaded at start, each one reloadable
    strict_readiness: bool = True
    exit_timeout_s: int = 5  # in-flight requests get this long after SIGTERM (Triton's default: 30)
    tracing: TritonTracing | None = None  # Triton's OpenTelemetry tracing; off by default
    # Triton's local response cache, shared by the models that turn it on; 0: none
    cache_bytes: int = 0

    def __post_init__(self) -> None:
        if self.cache_bytes != 0 and self.cache_bytes < MIN_CACHE_BYTES:
            raise ValueError(
                f"the response cache size is in bytes: {self.cache_bytes} is below {MIN_CACHE_BYTES} "
                f"(1 MiB); e.g. {256 << 20} for 256 MiB"
            )

    @property
    def reloadable(self) -> bool:
        """Whether one model can be reloaded through Triton's model-control API."""
        return self.model_control_mode == "explicit"


def _pytriton_root() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonStartError(
            "nvidia-pytriton is not installed; `pip install nvidia-pytriton==0.7.0`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def triton_binary() -> Path:
    return _pytriton_root() / "tritonserver" / "bin" / "tritonserver"


def cache_directory() -> Path:
    """The wheel's cache libraries (`local/libtritoncache_local.so`); Triton looks in /opt/tritonserver otherwise."""
    return _pytriton_root() / "tritonserver" / "caches"


def backend_directory() -> Path:
    """A backend dir holding the wheel's Python backend plus the stub for this interpreter.

    Keyed by the wheel's location, so two virtual environments never share (or overwrite the
    running binaries of) one directory; files are replaced atomically for the same reason.
    """
    server = _pytriton_root() / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonStartError(
            f"the nvidia-pytriton wheel has no Python backend stub for Python {version}"
        )
    key = hashlib.sha256(str(server).encode()).hexdigest()[:12]
    target = CACHE_DIR / "triton-backends" / f"{key}-py{version}"
    python_dir = target / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for source in [*(server / "backends" / "python").iterdir(), stub]:
        dest = python_dir / source.name
        if source.is_file() and (not dest.exists() or dest.stat().st_size != source.stat().st_size):
            staging = dest.with_name(f".{dest.name}.{os.getpid()}")
            shutil.copy2(source, staging)
            os.replace(staging, dest)
    return target


def triton_environment() -> dict[str, str]:
    env = dict(os.environ)
    libs = _pytriton_root().parent / "nvidia_pytriton.libs"
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p
    )
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    return env


def triton_command(options: TritonOptions) -> list[str]:
    ports = options.ports
    return [
        str(triton_binary()),
        f"--model-repository={options.repo.resolve()}",
        f"--backend-directory={backend_directory()}",
        f"--http-address={options.host}",
        f"--http-port={ports.http}",
        f"--grpc-address={options.host}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-address={options.host}",
        f"--metrics-port={ports.metrics}",
        f"--model-control-mode={options.model_control_mode}",
        *(["--load-model=*"] if options.reloadable else []),
        f"--exit-timeout-secs={options.exit_timeout_s}",
        f"--log-verbose={options.log_verbose}",
        f"--strict-readiness={str(options.strict_readiness).lower()}",
        "--exit-on-error=true",
        # Every config prensa renders is complete; auto-completing one starts an extra stub per
        # Python-backend model before its instances, most of a stage's (re)load time.
        "--disable-auto-complete-config",
        "--allow-sagemaker=false",
        "--allow-vertex-ai=false",
        *(options.tracing.args() if options.tracing else []),
        *(
            [
                f"--cache-config=local,size={options.cache_bytes}",
                f"--cache-directory={cache_directory()}",
            ]
            if options.cache_bytes
            else []
        ),
    ]


def port_holder(host: str, port: int) -> str | None:
    """Who listens on `host:port` ("tritonserver (pid 123)"), "another process" when it cannot be
    told, or None when the port is free."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # TIME_WAIT leftovers do not count
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
            return None
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    for connection in psutil.net_connections("inet"):
        # A listening inet socket always has a local address: never psutil's empty tuple.
        if (
            connection.status == psutil.CONN_LISTEN
            and connection.laddr.port == port  # type: ignore[union-attr]
            and connection.pid
        ):
            try:
                return f"{psutil.Process(connection.pid).name()} (pid {connection.pid})"
            except psutil.NoSuchProcess:
                continue
    return "another process"


def die_with_parent(parent: int) -> None:
    """In the forked child, before exec: SIGKILL when prensa (pid `parent`) dies; if it already
    has, exit now. Calls prctl alone: nothing that could wait on a lock another thread held."""
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


class TritonProcess:
    """One tritonserver child process, its log file and its readiness."""

    def __init__(self, options: TritonOptions, log_path: Path | None = None) -> None:
        self.options = options
        self.log_path = log_path or CACHE_DIR / "logs" / f"tritonserver-{options.ports.http}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log_read = 0  # bytes of this run's log that `new_error_lines` has looked at

    @property
    def http_url(self) -> str:
        return f"{self.options.host}:{self.options.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.options.host}:{self.options.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.options.host}:{self.options.ports.metrics}/metrics"

    @property
    def exit_deadline_s(self) -> float:
        """How long after SIGTERM Triton is left before SIGKILL: its exit timeout, and a second."""
        return self.options.exit_timeout_s + 1.0

    def check_ports(self) -> None:
        """Fail before starting when a port is taken: Triton would load every model first and only
        then fail to bind, while whatever holds the port answers the readiness check."""
        ports = self.options.ports
        for role, port in (("HTTP", ports.http), ("gRPC", ports.grpc), ("metrics", ports.metrics)):
            if holder := port_holder(self.options.host, port):
                orphan = (
                    " - a Triton left running by a prensa that was killed? Stop it, then start again"
                    if holder.startswith("tritonserver")
                    else ""
                )
                raise TritonStartError(
                    f"Triton's {role} port {self.options.host}:{port} is taken by {holder}{orphan}"
                )

    def start(self) -> None:
        """Start tritonserver, which dies with the thread calling this (see the module docstring):
        call it from a thread that outlives Triton, the main thread or the supervisor's."""
        self.check_ports()
        leftovers.clear()  # what an earlier Triton killed abruptly left: orphaned stubs, their /dev/shm regions
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_read = 0
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                triton_command(self.options),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=triton_environment(),
                start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),  # noqa: PLW1509 - prctl only
            )

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def error_lines(self) -> str:
        """Triton's error lines (model load failures and the like), without CPU-only noise; may be empty."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(filter(is_error_line, text.splitlines()))

    def new_error_lines(self) -> str:
        """The error lines Triton wrote since the last call (whole lines only); may be empty."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_read)
                chunk = log.read()
        except FileNotFoundError:
            return ""
        whole = chunk[: chunk.rfind(b"\n") + 1]
        self._log_read += len(whole)
        return "\n".join(filter(is_error_line, whole.decode(errors="replace").splitlines()))

    def errors(self) -> str:
        """Triton's error lines, or the end of its log when it logged none."""
        return self.error_lines() or self.log_tail()

    def _metrics_listening(self) -> bool:
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5.0) as response:  # noqa: S310 - Triton's own port
                return cast(bool, response.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Poll server readiness; with strict readiness that means every model loaded and warm. The
        metrics port must answer too: Triton may report ready a moment before it listens there."""
        assert self.process is not None, "start() first"
        client = httpclient.InferenceServerClient(self.http_url, network_timeout=5.0)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise TritonStartError(
                        f"tritonserver exited with code {self.process.returncode}:\n{self.errors()}"
                    )
                try:
                    if client.is_server_ready() and self._metrics_listening():
                        return
                except Exception:  # noqa: BLE001 - not listening yet
                    pass
                time.sleep(0.25)
        finally:
            client.close()
        self.stop()
        raise TritonStartError(
            f"tritonserver was not ready after {timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def terminate(self) -> None:
        """Ask Triton to drain and exit; safe inside a signal handler (no waiting)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self) -> int | None:
        """SIGTERM (Triton drains in-flight requests for its exit timeout), then SIGKILL if it
        lingers, as it does when a stub died. Python-backend stubs of a Triton that died abruptly
        outlive it; they share its process group and go too."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=self.exit_deadline_s)
        self.reap_group()
        code = self.process.wait()
        leftovers.clear()
        return code

    def reap_group(self) -> None:
        """SIGKILL what is left of Triton's process group: the Python-backend stubs of a Triton that
        died abruptly outlive it."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):  # the group is already empty
            os.killpg(self.process.pid, signal.SIGKILL)

    def __enter__(self) -> TritonProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
