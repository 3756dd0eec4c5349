"""S3 endpoints that speak the protocol, for the tests: moto's server (moto 5, ``moto[server]``).

- :func:`threaded_moto_s3`: ``moto.server.ThreadedMotoServer`` on a free port of 127.0.0.1 (a werkzeug server
  in a daemon thread of this process: moto ``moto_server/threaded_moto_server.py``). Every threaded server
  of one process shares one in-memory backend (moto's backends are module globals), so the session has one
  (tests/conftest.py's ``s3`` fixture) and each test module uses buckets of its own names.
- :func:`moto_s3_process`: ``python -m moto.server`` in a child process, for an endpoint whose buckets the
  threaded one does not see (a corpus on one endpoint, the outputs on another).

moto accepts any credentials; the fake ones below are set in the environment while an endpoint is up, so
that boto3 and s3fs sign requests without looking further (and never with a developer's real keys).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple

import pytest

#: What botocore reads first (its EnvProvider), so no profile, config file or instance metadata is consulted.
FAKE_AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class S3Endpoint(NamedTuple):
    """An S3 endpoint and a boto3 client on it; unpacks as ``endpoint, client``."""

    endpoint: str  # http://127.0.0.1:<port>
    client: Any  # boto3 S3 client

    def bucket(self, name: str) -> str:
        """Create bucket ``name`` unless it exists; returns ``name``."""
        if name not in {b["Name"] for b in self.client.list_buckets()["Buckets"]}:
            self.client.create_bucket(Bucket=name)
        return name


def _client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
                        region_name=FAKE_AWS_ENV["AWS_DEFAULT_REGION"])


@contextmanager
def fake_aws_env() -> Iterator[None]:
    """:data:`FAKE_AWS_ENV` in ``os.environ`` for the block, the previous values back after it."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in FAKE_AWS_ENV.items():
            mp.setenv(k, v)
        yield


@contextmanager
def threaded_moto_s3() -> Iterator[S3Endpoint]:
    """moto's threaded server on a free port of 127.0.0.1, stopped (thread joined) after the block."""
    from moto.server import ThreadedMotoServer

    with fake_aws_env():
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            yield S3Endpoint(endpoint, _client(endpoint))
        finally:
            server.stop()


@contextmanager
def moto_s3_process(timeout_s: float = 60.0) -> Iterator[S3Endpoint]:
    """``python -m moto.server`` on a free port of 127.0.0.1 with its own state; waits until it answers
    (RuntimeError naming the port and exit status when it does not within ``timeout_s``), terminated after
    the block."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with fake_aws_env():
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            endpoint = f"http://127.0.0.1:{port}"
            s3 = S3Endpoint(endpoint, _client(endpoint))
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    s3.client.list_buckets()
                    break
                except Exception:  # noqa: BLE001 - not listening yet
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"moto server on port {port} did not start (exit {proc.poll()})")
                    time.sleep(0.2)
            yield s3
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
