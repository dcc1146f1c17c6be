"""This node's view of the network before a launch: the master's port, the address the
other nodes reach this one by, and the interface holding it.

With several interfaces, or in a network namespace, the host name often resolves to an
address the other nodes cannot reach; the routing table knows the right one.
"""

from __future__ import annotations

import errno
import socket
import time

from polytrain.distributed.launcher import LaunchSpec
from polytrain.errors import ClusterError


def check_master_port(spec: LaunchSpec) -> None:
    """On node 0, the master port must be free (node 0 hosts the rendezvous there)."""
    if spec.node_rank != 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no conflict
        try:
            sock.bind((spec.master_addr, spec.master_port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ClusterError(
                    f"Port {spec.master_port} is already in use on this host, the master "
                    f"(node rank 0): another job or a leftover process listens there. Pick "
                    f"a free port, e.g. --master {spec.master_addr}:{free_port()}."
                ) from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ClusterError(
                    f"--master {spec.master_addr} is not an address of this host, but node "
                    "rank 0 hosts the rendezvous: run node rank 0 on that host, or give "
                    "this host's address in --master."
                ) from None
            raise ClusterError(
                f"Cannot use the master {spec.master} on this host: {exc}."
            ) from None


def free_port() -> int:
    """A TCP port that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def node_address(spec: LaunchSpec) -> str:
    """This node's address towards the master: ``--host``, else the routing table's choice."""
    if spec.host:
        return spec.host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((spec.master_addr, spec.master_port))  # UDP: nothing is sent
            return str(sock.getsockname()[0])
    except OSError as exc:
        raise ClusterError(
            f"The master {spec.master} cannot be reached from this node: "
            f"{exc.strerror or exc}. Check --master, the network, or give this node's "
            "address with --host."
        ) from None


def interface_of(address: str) -> str | None:
    """The network interface holding an IPv4 address (Linux), e.g. ``lo`` for 127.0.0.1."""
    try:
        import fcntl
        import struct

        packed = socket.inet_aton(address)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _, name in socket.if_nameindex():
                request = struct.pack("256s", name.encode()[:15])
                try:
                    reply = fcntl.ioctl(sock.fileno(), 0x8915, request)  # SIOCGIFADDR
                except OSError:
                    continue
                if reply[20:24] == packed:
                    return name
    except (OSError, ImportError):
        return None
    return None


def probe_master(spec: LaunchSpec, seconds: float = 2.0) -> str:
    """One connection attempt to the master, described for an error message."""
    try:
        with socket.create_connection((spec.master_addr, spec.master_port), timeout=seconds):
            return f"{spec.master} accepts connections"
    except ConnectionRefusedError:
        return f"nothing listens on {spec.master} (connection refused)"
    except TimeoutError:
        return f"{spec.master} did not answer within {seconds:.0f} s"
    except OSError as exc:
        return f"{spec.master} cannot be reached ({exc.strerror or exc})"


def wait_for_master(spec: LaunchSpec, what: str) -> None:
    """Nodes other than 0: wait (``--timeout``) until ``what`` (the engine's process on
    the master, e.g. "The MXNet scheduler") answers at ``--master``, or fail clearly."""
    deadline = time.monotonic() + spec.timeout
    reason = ""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((spec.master_addr, spec.master_port), timeout=2):
                return
        except ConnectionRefusedError:
            reason = "connection refused"
        except TimeoutError:
            reason = "no answer"
        except OSError as exc:
            reason = exc.strerror or str(exc)
        time.sleep(0.5)
    raise ClusterError(
        f"{what} at {spec.master} could not be reached from node {spec.node_rank} within "
        f"{spec.timeout:.0f} s (--timeout; last attempt: {reason}). Check that node rank 0 "
        "runs and that its address and port are reachable from here."
    )
