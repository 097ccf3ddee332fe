"""Fixtures of the binding's tests: engines in this process, and a source in another (peer.py)."""

import json
import os
import select
import subprocess
import sys

import pytest

import orbite

HERE = os.path.dirname(os.path.abspath(__file__))


def pattern(n: int, seed: int) -> bytes:
    """The bytes peer.py fills its buffers with."""
    return bytes(bytearray((i * 131 + seed) & 0xFF for i in range(256)) * (n // 256))


class Peer:
    """A source engine in a child process."""

    def __init__(self, config: dict):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "peer.py"), json.dumps(config)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 60.0)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            raise RuntimeError("peer.py did not start (exit %s)" % self.proc.wait(10))
        info = json.loads(line)
        self.endpoint = info["endpoint"]
        self.epoch = info["epoch"]
        self.pid = info["pid"]
        self.rw, self.rw_len = info["rw"]
        self.ro, self.ro_len = info["ro"]

    def ask(self, command: str, timeout: float = 60.0) -> str:
        """One command, one line of answer, within `timeout` seconds (a stuck peer fails the test)."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError("peer.py did not answer %r within %.0f s" % (command, timeout))
        return self.proc.stdout.readline().strip()

    def get(self, address: int, length: int) -> bytes:
        return bytes.fromhex(self.ask("get %d %d" % (address, length)))

    def notifications(self) -> list:
        return json.loads(self.ask("notifications"))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            try:
                assert self.proc.wait(20) == 0
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def peer():
    p = Peer({})
    yield p
    p.stop()


@pytest.fixture
def requester():
    with orbite.Engine({"enable_source": False}) as e:
        yield e


@pytest.fixture
def pair():
    """A source and a requester engine in this process, and the requester's segment to it."""
    with orbite.Engine() as source, orbite.Engine({"enable_source": False}) as req:
        with req.open_segment(source.endpoint, source.epoch) as seg:
            yield source, req, seg
