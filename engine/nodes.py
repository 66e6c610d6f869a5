"""Where this process stands in a job of several nodes, read from torchrun's environment.

torchrun (and ptdash's launcher, which is torch's own) gives every worker ``GROUP_RANK``
(its node's place in the rendezvous), ``LOCAL_WORLD_SIZE``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` and ``TORCHELASTIC_RUN_ID``. A job spans several nodes when the world is
larger than the node's share of it. Node 0 (``GROUP_RANK`` 0) holds rank 0, whose engine
is the hub; the ranks of the other nodes reach it over the authenticated TCP link
(shared/authlink.py) at ``MASTER_ADDR``, port ``PTDASH_LINK_PORT`` or else ``MASTER_PORT + 1``.
The hub listens there only: on the address ``MASTER_ADDR`` has on its machine (the
interface the rendezvous uses), never on every interface. Stdlib only.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from .shared import events

PORT_ENV = "PTDASH_LINK_PORT"


@dataclass(frozen=True)
class Place:
    """This process's node in a job of several nodes."""

    node: int
    """Its node's group rank (0: the hub's node)."""
    nodes: int | None
    """How many nodes, when known (``PTDASH_NNODES`` from ptdash's launcher, else torchrun's
    ``GROUP_WORLD_SIZE``)."""
    host: str
    """``MASTER_ADDR``: node 0's address, where the hub listens."""
    port: int
    """The hub's TCP port."""
    job: str
    """The rendezvous id: a node of another job is refused."""

    @property
    def remote(self) -> bool:
        """On another node than the hub's."""
        return self.node != 0

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _int(environ, name: str) -> int | None:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        return None


def link_port(master_port: int, environ=os.environ) -> int:
    """The hub's port: ``PTDASH_LINK_PORT``, or the rendezvous port + 1."""
    return _int(environ, PORT_ENV) or master_port + 1


def place(environ=os.environ) -> Place | None:
    """This worker's node, or None when the job is on one node (or not under torchrun)."""
    world, local, node = _int(environ, "WORLD_SIZE"), _int(environ, "LOCAL_WORLD_SIZE"), _int(environ, "GROUP_RANK")
    port = _int(environ, "MASTER_PORT")
    if None in (world, local, node, port) or world <= local or not environ.get("MASTER_ADDR"):
        return None
    nodes = _int(environ, "PTDASH_NNODES") or _int(environ, "GROUP_WORLD_SIZE")  # ptdash's launcher, torchrun's
    return Place(node=node, nodes=nodes, host=environ["MASTER_ADDR"],
                 port=link_port(port, environ), job=environ.get("TORCHELASTIC_RUN_ID", ""))


def _own_address(host: str) -> str | None:
    """The first address of ``host`` that belongs to this machine, or None."""
    for family, _, _, _, address in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM):
        probe = socket.socket(family, socket.SOCK_STREAM)
        try:
            probe.bind((address[0], 0))
            return address[0]
        except OSError:
            continue
        finally:
            probe.close()
    return None


def _route_from(address: str, family: int) -> str:
    """The local address the route to ``address`` leaves from (no packet is sent)."""
    probe = socket.socket(family, socket.SOCK_DGRAM)
    try:
        probe.connect((address, 9))
        return probe.getsockname()[0]
    finally:
        probe.close()


def local_address(host: str) -> str:
    """The address of this machine by which ``host`` is reached: ``host``'s own address when
    it is this machine's (node 0, the rendezvous host), else the one the route to it leaves
    from. Raises OSError when ``host`` does not resolve."""
    own = _own_address(host)
    if own is not None:
        return own
    family, _, _, _, address = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0]
    return _route_from(address[0], family)


def loopback_name(host: str, address: str) -> bool:
    """A host name that names loopback here (Debian's ``127.0.1.1 gpu0``): the other nodes,
    to whom it names another address, cannot reach the hub there."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return False
    except ValueError:
        return ipaddress.ip_address(address).is_loopback and host != "localhost"


def is_local(host: str) -> bool:
    """Whether ``host`` names an address of this machine."""
    try:
        return _own_address(host) is not None
    except OSError:
        return False


def rank_target(config: dict, unix, environ=os.environ) -> tuple[object, dict | None]:
    """How this rank reaches the hub, and what it says of itself: ``unix`` (the hub's socket)
    and None on the hub's node; ``(host, port, key)`` and its hello on another; None when
    it cannot (no key: it says why, and trains without reporting)."""
    from .shared.linkkey import LinkKeyError, load_key

    where = place(environ)
    if where is None or not where.remote:
        return unix, None
    try:
        key = load_key()
    except LinkKeyError as exc:
        print(f"ptdash: rank {environ.get('RANK', '?')} runs without ptdash: {exc}", flush=True)
        return None, None
    hello = {"host": socket.gethostname(), "node": where.node, "job": where.job, "config": config}
    return (where.host, where.port, key), hello


def open_port(hub, config: dict, info, event, environ=os.environ):
    """The hub of a job of several nodes: its TCP port for the other nodes (nodeport.py), or
    None (one node; or it cannot listen, which a warning says: the other nodes then train
    without ptdash, and clip and LR changes are refused)."""
    from .nodeport import NodePort
    from .shared.linkkey import LinkKeyError, load_key

    where = place(environ)
    if where is None or where.remote:
        return None
    try:
        run = {"run_dir": info.run_dir, "run_id": info.id, "host": hub.host}  # what node launchers are told
        port = NodePort(hub, local_address(where.host), where.port, load_key(), where.job, config,
                        Path(info.run_dir) / "output.log", run, event, nodes=where.nodes)
        port.start()
    except (OSError, LinkKeyError) as exc:
        event("warning", f"the hub cannot listen for the other nodes at {where.address}: {exc}; their ranks run "
              f"without ptdash (set {PORT_ENV} to another port)")
        return None
    event(events.Node(node=0, host=port.host, port=port.port),
          f"the hub listens for the other nodes at {port.host}:{port.port}")
    if loopback_name(where.host, port.host):
        event("warning", f"{where.host} names {port.host} on this machine, a loopback address other machines "
              "cannot reach: give --rdzv-endpoint an address (or a name every node resolves alike)")
    return port
