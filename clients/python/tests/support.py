"""Real servers for the package's tests: nats-server, redis-server and a `toolmesh node`.

Each picks or finds its own port (nats-server `-p -1` read back from its log; redis-server,
which cannot pick one, on random candidates retried while taken), is started by a class
method and stopped by `stop()`. Waiting is polling a condition with a deadline (`wait_until`).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, TypeVar

import nats

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[3]
SERVER_START_S = 15.0


def binary(name: str, package: str) -> str:
    """The path of `name` on PATH, or a failure naming the package that provides it."""
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not on PATH: install the Debian package {package}")
    return path


def wait_until(condition: Callable[[], Optional[T]], timeout: float, what: str) -> T:
    """Polls `condition` every 20 ms until it returns something other than None/False."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout} s")
        time.sleep(0.02)


async def wait_until_async(
    condition: Callable[[], Awaitable[Optional[T]]], timeout: float, what: str
) -> T:
    """`wait_until` for an async condition."""
    deadline = time.monotonic() + timeout
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout} s")
        await asyncio.sleep(0.02)


def run_async(coro: Awaitable[T]) -> T:
    """Runs `coro` to completion on a loop of its own thread (for sync fixtures, so that no
    event loop of pytest-asyncio is touched)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coro)  # type: ignore[arg-type]
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            result["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


class Process:
    """A child process whose output goes to a log file; `stop()` ends it."""

    def __init__(self, args: list[str], log: Path, env: Optional[dict[str, str]] = None,
                 cwd: Optional[Path] = None) -> None:
        self.log_path = log
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
            stdin=subprocess.DEVNULL,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL when it has not exited within `grace` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def kill(self) -> None:
        """SIGKILL now (a crash)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Server:
    """A server process listening on 127.0.0.1:`port`, reached at `<scheme>://`."""

    scheme = ""

    def __init__(self, process: Process, port: int) -> None:
        self.process = process
        self.port = port

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.stop()


class NatsServer(Server):
    """A nats-server on 127.0.0.1 at a port it picks, JetStream on, storing under `dir`."""

    scheme = "nats"

    @classmethod
    def start(cls, dir: Path) -> "NatsServer":
        dir.mkdir(parents=True, exist_ok=True)
        log = dir / "nats-server.log"
        process = Process(
            [binary("nats-server", "nats-server"), "-a", "127.0.0.1", "-p", "-1",
             "-js", "-sd", str(dir / "jetstream")],
            log,
        )

        def port() -> Optional[int]:
            if not process.running():
                raise RuntimeError(f"nats-server exited:\n{process.log()}")
            text = process.log()
            found = re.search(r"Listening for client connections on [\d.]+:(\d+)", text)
            if found and "Server is ready" in text:
                return int(found.group(1))
            return None

        try:
            found = wait_until(port, SERVER_START_S, "nats-server is ready")
        except BaseException:
            process.kill()
            raise
        return cls(process, found)


def candidate_port() -> int:
    """A random port below the kernel's ephemeral range, where no port-0 listener lands."""
    low = 32768
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    top = low if low > 11000 else 65536
    return random.randrange(10000, top)


class RedisServer(Server):
    """A redis-server on 127.0.0.1 without persistence, on a random candidate port (retried
    while taken: redis-server cannot pick its own)."""

    scheme = "redis"

    @classmethod
    def start(cls, dir: Path, tries: int = 50) -> "RedisServer":
        dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(tries):
            port = candidate_port()
            log = dir / f"redis-server-{attempt}.log"
            process = Process(
                [binary("redis-server", "redis-server"), "--port", str(port), "--bind",
                 "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(dir)],
                log,
            )

            def state() -> Optional[str]:
                text = process.log()
                if "Ready to accept connections" in text:
                    return "ready"
                if "Address already in use" in text:
                    return "taken"
                if not process.running():
                    raise RuntimeError(f"redis-server exited:\n{text}")
                return None

            try:
                outcome = wait_until(state, SERVER_START_S, "redis-server is ready")
            except BaseException:
                process.kill()
                raise
            if outcome == "ready":
                return cls(process, port)
            process.kill()
        raise RuntimeError(f"redis-server found no free port in {tries} tries")


def toolmesh_binary() -> Path:
    """`TOOLMESH_BIN`, or the debug build of this repository."""
    path = Path(os.environ.get("TOOLMESH_BIN", REPO / "target" / "debug" / "toolmesh"))
    if not path.is_absolute():
        path = REPO / path
    if not path.exists():
        raise RuntimeError(f"no toolmesh binary at {path}: run `cargo build` or set TOOLMESH_BIN")
    return path


async def status_answers(nats_url: str, node_id: str) -> bool:
    """Whether `toolmesh.v1.status.<node_id>` answers (the node's readiness signal)."""
    try:
        nc = await nats.connect(nats_url, connect_timeout=1, allow_reconnect=False)
    except Exception:  # noqa: BLE001 - not ready yet
        return False
    try:
        await nc.request(f"toolmesh.v1.status.{node_id}", b"{}", timeout=0.5)
        return True
    except Exception:  # noqa: BLE001 - no responders yet, or a timeout
        return False
    finally:
        await nc.close()


class ToolmeshNode:
    """A `toolmesh node` process (the real binary) against `nats` and `redis`."""

    def __init__(self, process: Process, node_id: str, nats_url: str, data_dir: Path,
                 account: str) -> None:
        self.process = process
        self.node_id = node_id
        self.nats_url = nats_url
        self.data_dir = data_dir
        self.account = account

    @classmethod
    def start(cls, nats_url: str, redis_url: str, dir: Path, roles: str, account: str,
              env: Optional[dict[str, str]] = None, timeout: float = 30.0) -> "ToolmeshNode":
        data_dir = dir / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        node_id = f"pytest-{os.getpid()}"
        # Nothing of the caller's toolmesh configuration leaks in.
        full = {k: v for k, v in os.environ.items() if not k.startswith("TOOLMESH_")}
        full.update({
            "TOOLMESH_NATS_URL": nats_url,
            "TOOLMESH_REDIS_URL": redis_url,
            "TOOLMESH_DATA_DIR": str(data_dir),
            "TOOLMESH_NODE_ID": node_id,
            "TOOLMESH_SKILLS_DIR": str(dir / "skills"),
            "TOOLMESH_DRAIN_TIMEOUT_S": "5",
            "RUST_LOG": os.environ.get("RUST_LOG", "warn"),
        })
        full.update(env or {})
        process = Process([str(toolmesh_binary()), "node", "--roles", roles],
                          dir / "node.log", env=full, cwd=dir)

        async def ready() -> None:
            async def answers() -> bool:
                if not process.running():
                    raise RuntimeError(f"toolmesh node exited during startup:\n{process.log()}")
                return await status_answers(nats_url, node_id)

            await wait_until_async(answers, timeout, f"node {node_id} answers status")

        try:
            run_async(ready())
        except BaseException:
            log = process.log()
            process.kill()
            raise RuntimeError(f"toolmesh node did not start; its log:\n{log}")
        return cls(process, node_id, nats_url, data_dir, account)

    def stop(self) -> None:
        # SIGTERM drains within TOOLMESH_DRAIN_TIMEOUT_S (5) plus the node's own margins.
        self.process.stop(grace=20.0)


class ClosedPort:
    """A loopback port held bound but not listening: a connection to it is refused at once,
    and nobody else can listen there while this object lives."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind(("127.0.0.1", 0))
        self.port: int = self.socket.getsockname()[1]

    def close(self) -> None:
        self.socket.close()


def temp_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
