"""Three real `fenced run` processes on loopback, as tests/src/lib.rs starts
them: --initial-cluster, a data directory each, free ports.

The binary is $FENCED_BIN, else target/debug/fenced of the repository this
directory sits in (`cargo build -p fenced-server` first)."""

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from fenced_client import Client, FencedError

REPO = Path(__file__).resolve().parents[3]


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies, so
    that a killed test run leaves no node behind (Linux only)."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def fenced_bin() -> Path:
    path = Path(os.environ.get("FENCED_BIN", REPO / "target" / "debug" / "fenced"))
    if not path.exists():
        pytest.fail(f"{path} is missing: run `cargo build -p fenced-server` (or set FENCED_BIN)")
    return path


_next_port = random.randrange(22_000)


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range (32768 and
    up), so that no outgoing connection takes it before the node binds it;
    each call moves on from a random start."""
    global _next_port
    for _ in range(22_000):
        port = 10_000 + _next_port % 22_000
        _next_port += 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port between 10000 and 32000")


class Cluster:
    """``n`` nodes; ``env`` adds FENCED_* settings to every node."""

    def __init__(self, n: int = 3, env: Optional[Dict[str, str]] = None, tls: bool = False):
        self.dir = Path(tempfile.mkdtemp(prefix="fenced-py-"))
        self.bin = fenced_bin()
        self.env = dict(env or {})
        self.ids = list(range(1, n + 1))
        self.client_ports = {i: free_port() for i in self.ids}
        self.peer_ports = {i: free_port() for i in self.ids}
        self.procs: Dict[int, subprocess.Popen] = {}
        self.pki: Optional[Path] = None
        if tls:
            self.pki = self.dir / "pki"
            self.certs("ca")
            for i in self.ids:
                self.certs("node", "--id", str(i), "--host", "127.0.0.1")
        self.initial = ",".join(
            f"{i}=127.0.0.1:{self.peer_ports[i]}/127.0.0.1:{self.client_ports[i]}" for i in self.ids
        )

    # -- certificates and tokens ------------------------------------------

    def certs(self, *args: str) -> None:
        assert self.pki is not None
        subprocess.run(
            [str(self.bin), "certs", *args, "--dir", str(self.pki)],
            check=True,
            capture_output=True,
        )

    def new_token(self) -> "tuple[str, str]":
        """A token and its SHA-256 from `fenced auth new-token`."""
        out = subprocess.run(
            [str(self.bin), "auth", "new-token"], check=True, capture_output=True, text=True
        ).stdout
        fields = dict(line.split(None, 1) for line in out.strip().splitlines())
        return fields["token"].strip(), fields["sha256"].strip()

    # -- processes -----------------------------------------------------------

    @property
    def endpoints(self) -> List[str]:
        return [f"127.0.0.1:{self.client_ports[i]}" for i in self.ids]

    def start(self) -> "Cluster":
        for i in self.ids:
            self.spawn(i)
        self.wait_for_leader(20.0)
        return self

    def spawn(self, i: int) -> None:
        env = dict(os.environ)
        env["FENCED_LOG"] = "info,openraft=warn"
        env.update(self.env)
        if self.pki is not None:
            env["FENCED_TLS_CERT"] = str(self.pki / f"node-{i}.pem")
            env["FENCED_TLS_KEY"] = str(self.pki / f"node-{i}-key.pem")
            env["FENCED_TLS_CA"] = str(self.pki / "ca.pem")
        log = open(self.dir / f"node{i}.log", "ab")
        self.procs[i] = subprocess.Popen(
            [
                str(self.bin), "run",
                "--id", str(i),
                "--data-dir", str(self.dir / f"node{i}"),
                "--listen", f"127.0.0.1:{self.client_ports[i]}",
                "--peer-listen", f"127.0.0.1:{self.peer_ports[i]}",
                "--initial-cluster", self.initial,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        log.close()

    def client(self, endpoints: Optional[List[str]] = None, **kwargs) -> Client:
        kwargs.setdefault("env", False)
        return Client(endpoints or self.endpoints, **kwargs)

    def admin_client(self, i: int) -> Client:
        """A client of node ``i`` alone, for status."""
        kw = {}
        if self.pki is not None:
            kw["ca"] = self.pki / "ca.pem"
        return Client([self.endpoints[i - 1]], env=False, call_timeout=2.0, **kw)

    def wait_for_leader(self, within: float) -> int:
        deadline = time.monotonic() + within
        clients = {i: self.admin_client(i) for i in self.ids}
        try:
            while True:
                leaders = []
                for i in self.ids:
                    try:
                        leaders.append(clients[i].status().leader_id)
                    except FencedError:
                        leaders.append(None)
                if leaders[0] and all(l == leaders[0] for l in leaders):
                    return leaders[0]
                if time.monotonic() > deadline:
                    raise AssertionError(f"no agreed leader within {within} s: {leaders}\n{self.logs()}")
                time.sleep(0.05)
        finally:
            for c in clients.values():
                c.close()

    def signal(self, i: int, sig: int) -> None:
        self.procs[i].send_signal(sig)

    def logs(self) -> str:
        out = []
        for i in self.ids:
            p = self.dir / f"node{i}.log"
            if p.exists():
                text = p.read_text(errors="replace")
                out.append(f"--- node {i}\n{text[-4000:]}")
        return "\n".join(out)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
        for p in self.procs.values():
            p.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster():
    c = Cluster(3)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def client(cluster):
    c = cluster.client()
    yield c
    c.close()


@pytest.fixture
def resource(request) -> str:
    """A resource name of the test's own, so tests share one cluster."""
    return f"py/{request.node.name}/{random.getrandbits(32):08x}"
