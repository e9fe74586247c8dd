"""The llama.cpp server ``ablate`` starts itself for ``ref=served`` with no ``ref.url``: llama-cpp-python's
OpenAI-compatible server on a free loopback port, serving one GGUF file, stopped with the job (or when the
regime is garbage-collected, or at exit). On Linux the server also gets SIGTERM from the kernel when the process that
started it dies by any means (``PR_SET_PDEATHSIG``): a job killed with SIGKILL, or a pytest-xdist worker that ends
with ``os._exit`` (no atexit handler, no finalizer), leaves no server behind. Its log goes to a file whose last lines
any start-up failure quotes.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from ablate.errors import AblateError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: ask the kernel for SIGTERM when the parent goes (Linux; elsewhere nothing). The
    signal follows the thread that made the child: servers are started from a job's main thread."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _tail(path: Path, n: int = 3) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


class LlamaCppServer:
    """One llama-cpp-python server process serving ``model`` (a GGUF file) on 127.0.0.1."""

    def __init__(self, model: Path, *, n_ctx: int, threads: int, log: Path, startup_timeout_s: float = 120.0):
        self.model, self.log = Path(model), Path(log)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "ablate.serving.llama_server", "--model", str(self.model), "--host", "127.0.0.1",
            "--port", str(self.port), "--n_ctx", str(n_ctx), "--n_threads", str(threads),
            "--n_threads_batch", str(threads), "--logits_all", "true", "--verbose", "false",
        ]  # fmt: skip
        t0 = time.perf_counter()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent
            )
        atexit.register(self.stop)
        self._wait(startup_timeout_s)
        self.startup_s = time.perf_counter() - t0

    def _wait(self, timeout_s: float) -> None:
        import requests

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AblateError(
                    f"ref=served: the llama.cpp server exited ({self.process.returncode}) while starting: "
                    f"{_tail(self.log) or 'no output'} (log: {self.log})"
                )
            try:
                if requests.get(self.url + "/v1/models", timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise AblateError(f"ref=served: the llama.cpp server did not answer within {timeout_s:g} s (log: {self.log})")

    def rss_bytes(self) -> int:
        """The server process's resident memory now (0 once it has exited)."""
        try:
            import psutil

            return psutil.Process(self.process.pid).memory_info().rss
        except Exception:
            return 0

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        atexit.unregister(self.stop)


def version() -> str:
    from importlib.metadata import version as v

    return f"llama-cpp-python {v('llama-cpp-python')}"


def threads_default() -> int:
    return max(1, (os.cpu_count() or 2) // 2)
