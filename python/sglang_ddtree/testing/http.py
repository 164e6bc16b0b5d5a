"""Standard-library HTTP helpers for talking to a local SGLang server (tests and benchmarks)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

from sglang_ddtree.serve import answers_health as healthy


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, payload: dict | None = None, timeout: float = 60.0) -> tuple[int, dict]:
    """GET (no payload) or POST JSON; returns (status, decoded body), also for HTTP errors."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read().decode()
            return r.status, (json.loads(body) if body.strip() else {})
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        try:
            return e.code, json.loads(body)
        except json.JSONDecodeError:
            return e.code, {"raw": body[:500]}


@contextmanager
def launched_server(cmd: list[str], base: str, log_path: str, ready=healthy, timeout: float = 300):
    """Run ``cmd`` (a server listening at ``base``, output to ``log_path``) until ``ready(base)``;
    yield the process; terminate it on exit. Raises when it exits or is not ready in time."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + timeout
            while not ready(base):
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}; see {log_path}")
                if time.time() > deadline:
                    raise RuntimeError(f"server not ready in {timeout:.0f} s; see {log_path}")
                time.sleep(2)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
