"""Two machines for real: two network namespaces joined by a veth pair, one node in each.

Each namespace has its own network stack (only ``lo`` and one end of the veth pair,
addresses in 10.231.7.0/24 that exist only inside them), so the two ``polytrain launch``
processes meet over a real link exactly as two hosts would: node 1 reaches the master
at 10.231.7.1, the engines must bind and advertise the veth address, not the host
name's. Needs permission to create namespaces (root or CAP_NET_ADMIN); skipped with the
reason otherwise. The namespaces are removed afterwards, also when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from launch_helpers import (
    POLYTRAIN,
    clean_env,
    launch_command,
    launchable_backends,
    load_npz,
    log_text,
    max_param_diff,
    reference_params,
    steps_command,
)

pytestmark = [pytest.mark.slow, pytest.mark.netns]

SUBNET = "10.231.7"
MASTER_ADDR = f"{SUBNET}.1"
PARITY_ATOL = 1e-6


@dataclass
class Pair:
    """Two namespaces; node ``i`` lives in ``names[i]`` at ``addresses[i]``."""

    names: tuple[str, str]
    addresses: tuple[str, str]

    def exec_prefix(self, node: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[node]]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _must(*args: str) -> None:
    proc = _ip(*args)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")


def _netns_permitted() -> str | None:
    """None if namespaces can be created here, else why not."""
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    probe = f"ptprobe-{uuid.uuid4().hex[:8]}"
    proc = _ip("netns", "add", probe)
    if proc.returncode != 0:
        return f"'ip netns add' is not permitted here: {proc.stderr.strip()}"
    _ip("netns", "delete", probe)
    return None


def _remove(names: tuple[str, ...]) -> None:
    for name in names:
        pids = _ip("netns", "pids", name).stdout.split()
        for pid in pids:  # anything a failed test left running inside
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        _ip("netns", "delete", name)  # takes its end of the veth pair along


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    reason = _netns_permitted()
    if reason is not None:
        pytest.skip(reason)
    tag = uuid.uuid4().hex[:6]  # unique per run: interface names have at most 15 characters
    names = (f"pt-{tag}-a", f"pt-{tag}-b")
    links = (f"pt{tag}a", f"pt{tag}b")
    addresses = (f"{SUBNET}.1", f"{SUBNET}.2")
    try:
        for name in names:
            _must("netns", "add", name)
        _must("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for name, link, address in zip(names, links, addresses, strict=True):
            _must("link", "set", link, "netns", name)
            _must("-n", name, "addr", "add", f"{address}/24", "dev", link)
            _must("-n", name, "link", "set", link, "up")
            _must("-n", name, "link", "set", "lo", "up")
        ping = subprocess.run(
            ["ip", "netns", "exec", names[1], sys.executable, "-c",
             f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
             f"s.connect(('{addresses[0]}', 9)); print(s.getsockname()[0])"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert ping.stdout.strip() == addresses[1], ping.stderr
        yield Pair(names, addresses)
    finally:
        _remove(names)
        if _ip("link", "show", links[0]).returncode == 0:  # not moved yet when setup failed
            _ip("link", "delete", links[0])


@pytest.fixture(scope="module", params=launchable_backends())
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "jax":  # docs/distributed.md, "JAX"
        pytest.skip("XLA's Gloo (jaxlib 0.4.30) takes its address from the host name, which "
                    "a namespace cannot reach; it has no interface setting")  # fmt: skip
    return str(request.param)


def test_two_namespaces_equal_one_process_on_the_full_batch(
    pair: Pair, backend: str, tmp_path: Path
) -> None:
    reference = reference_params(backend, tmp_path / "single")
    out = tmp_path / "dist"
    out.mkdir()
    master = f"{MASTER_ADDR}:29500"  # a fresh network stack: every port is free
    nodes = []
    for node in (0, 1):
        cmd = launch_command(backend, master, tmp_path / f"logs{node}",
                             steps_command(backend, out), nproc=1, nnodes=2, node_rank=node,
                             timeout=120)  # fmt: skip
        with open(tmp_path / f"launch{node}.log", "w") as log:  # not a pipe: it could fill
            cmd = [*pair.exec_prefix(node), *cmd]
            nodes.append(subprocess.Popen(cmd, env=clean_env(), stdout=log, stderr=log))
    try:
        for proc in nodes:
            proc.wait(timeout=240)
    finally:
        for proc in nodes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = log_text(tmp_path) + log_text(tmp_path / "logs0") + log_text(tmp_path / "logs1")
    assert [p.returncode for p in nodes] == [0, 0], logs
    rank0, rank1 = load_npz(out / "rank0.npz"), load_npz(out / "rank1.npz")
    diff = max_param_diff(reference, rank0)
    print(f"{backend}: 2 namespaces vs 1 process on the full batch, max |diff| {diff:.2e}")
    assert diff <= PARITY_ATOL
    assert max_param_diff(rank0, rank1) == 0.0


def test_the_link_is_the_only_way_between_the_nodes(pair: Pair) -> None:
    """The namespaces see each other only over the veth pair (not the host's network)."""
    env = clean_env()
    code = "from polytrain.distributed.network import interface_of; print(interface_of('{}'))"
    for node in (0, 1):
        proc = subprocess.run(
            [*pair.exec_prefix(node), *POLYTRAIN[:1], "-c", code.format(pair.addresses[node])],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert proc.stdout.strip().startswith("pt"), proc.stdout
    links = _ip("-n", pair.names[0], "-o", "link").stdout
    assert "lo" in links and len(links.strip().splitlines()) == 2, links
