"""Process sampling through psutil: what the soak and the lab read about another process."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from specgate_lab.promlab import listening_ports
from tests.deploy.helpers import load_module

SOAK = Path(__file__).resolve().parents[2] / "loadtests" / "soak.py"
# A child that opens a listening socket and a file, says its port, then waits.
_CHILD = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "f = open(sys.executable, 'rb')\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    return load_module(SOAK, "specgate_soak")


@pytest.fixture
def child() -> Iterator[tuple[int, int]]:
    """(pid, listening port) of an idle child process."""
    with subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline())
            yield proc.pid, port
        finally:
            proc.kill()


def _vmrss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def test_listening_ports_finds_the_port_a_process_bound(child: tuple[int, int]) -> None:
    pid, port = child
    assert port in listening_ports(pid)
    # a connected socket of that process is not a listening one
    with socket.create_connection(("127.0.0.1", port)):
        assert listening_ports(pid) == {port}


def test_listening_ports_of_a_process_that_is_gone_is_empty() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert listening_ports(proc.pid) == set()


def test_proc_sample_reads_rss_as_vmrss_and_counts_fds(soak: ModuleType, child: tuple[int, int]) -> None:
    pid, _ = child
    rss, fds = soak.proc_sample(pid)
    assert rss == _vmrss_kib(pid)  # an idle process: the same figure /proc/PID/status shows
    assert fds == len(os.listdir(f"/proc/{pid}/fd"))


def test_fd_detail_names_sockets_and_files(soak: ModuleType, child: tuple[int, int]) -> None:
    pid, port = child
    detail = soak.fd_detail(pid)
    assert any(line.endswith(f"tcp :{port} -> :0 LISTEN") for line in detail), detail
    assert any(line.endswith(os.path.realpath(sys.executable)) for line in detail), detail


def test_the_sampler_stops_when_the_process_is_gone(soak: ModuleType) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    out: list[tuple[float, int, int]] = []
    asyncio.run(soak.sampler(proc.pid, 0.0, out, 0.01, asyncio.Event()))
    assert out == []
