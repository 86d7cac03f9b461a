"""Where the load actors run: ``--ray`` and ``--ray-resources`` as given, and the nodes
that can hold an actor."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perfscope.errors import UsageError


@dataclass(frozen=True)
class RayTarget:
    """Where the actors run.

    Attributes:
        address: a Ray cluster address (``ray://host:10001``, ``host:6379``, ``auto``), or
            ``None`` to start a local cluster in this process.
        actors: load-generator actors to start.
    """

    address: str | None
    actors: int


def parse_ray_target(value: str | None, *, default_actors: int = 2) -> RayTarget:
    """``--ray`` as given: ``local:N`` (a private local cluster with N actors), an address
    (``auto``: the cluster ``ray start`` runs on this machine), or empty (bare ``--ray``:
    a private local cluster with ``default_actors`` actors).

    An address may carry the actor count as ``ADDRESS#N``.
    """
    text = (value or "").strip()
    if not text or text == "private":
        return RayTarget(address=None, actors=default_actors)
    if text.startswith("local"):
        _, _, n = text.partition(":")
        actors = _positive(n or str(default_actors), text)
        return RayTarget(address=None, actors=actors)
    address, _, n = text.partition("#")
    return RayTarget(address=address, actors=_positive(n, text) if n else default_actors)


def _positive(text: str, whole: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 1024:
        raise UsageError(
            f"--ray {whole!r}: the actor count must be a whole number from 1 to 1024 "
            "(e.g. --ray local:4)"
        )
    return n


_RESOURCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*")

#: The ``--ray-resources`` entry that keeps every load actor off the machine serving the
#: model (the ``openai:`` URL's host): a placement rule, not a Ray resource.
NOT_SERVER = "not-server"


def parse_ray_resources(
    value: str | Mapping[str, Any] | None, what: str = "--ray-resources"
) -> dict[str, float]:
    """``--ray-resources NAME=AMOUNT[,NAME=AMOUNT...]``: what every load actor asks Ray
    for, so Ray places it only on a node that offers that much (a custom resource given
    to the load nodes with ``ray start --resources``, ``CPU``, or ``node:IP`` to pin the
    actors to one node). Empty: no requirement (zero CPUs, any node). The entry
    ``not-server`` (no amount) is a rule: no actor on the machine of the model's server
    (:func:`off_server_nodes`); it is kept in the result as ``{"not-server": 1.0}``.

    Raises:
        UsageError: a malformed entry, a repeated name, or an amount that is not
            positive (or above 1 and not whole, which Ray refuses).
    """
    if value is None:
        return {}
    items: list[tuple[str, Any]]
    if isinstance(value, Mapping):
        items = list(value.items())
    else:
        items = []
        for part in (p.strip() for p in str(value).split(",")):
            if not part:
                continue
            if part == NOT_SERVER:
                items.append((NOT_SERVER, 1))
                continue
            name, eq, amount = part.partition("=")
            if not eq:
                raise UsageError(
                    f"{what} {part!r}: write NAME=AMOUNT, e.g. {what} loadgen=1 "
                    "(a resource the load nodes were started with)"
                )
            items.append((name.strip(), amount.strip()))
    out: dict[str, float] = {}
    for name, raw in items:
        if not isinstance(name, str) or not _RESOURCE_NAME.fullmatch(name):
            raise UsageError(f"{what}: {name!r} is not a Ray resource name (e.g. loadgen, CPU)")
        if name in out:
            raise UsageError(f"{what}: {name!r} is given twice")
        try:
            qty = float(raw) if not isinstance(raw, bool) else math.nan
        except (TypeError, ValueError):
            qty = math.nan
        if not (math.isfinite(qty) and qty > 0) or (qty > 1 and qty != int(qty)):
            raise UsageError(
                f"{what}: {name}={raw!r} must be a positive amount, whole above 1 "
                f"(e.g. {name}=1 or {name}=0.5)"
            )
        out[name] = qty
    return out


def _placement_nodes(ray: Any, resources: Mapping[str, float]) -> list[str]:
    """The addresses of the live nodes that offer ``resources`` to one actor.

    Raises:
        UsageError: no node does (Ray would leave the actors pending for ever).
    """
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    fits = [
        str(n.get("NodeManagerAddress") or n.get("NodeID") or "?")
        for n in nodes
        if all(float((n.get("Resources") or {}).get(k, 0.0)) >= v for k, v in resources.items())
    ]
    if fits:
        return fits
    offered = sorted({k for n in nodes for k in (n.get("Resources") or {})})
    want = ",".join(f"{k}={v:g}" for k, v in resources.items())
    first = next(iter(resources))
    shown = ", ".join(k for k in offered if not k.startswith(("object_store", "memory")))
    raise UsageError(
        f"--ray-resources {want}: no live node of the cluster offers that (its nodes offer "
        f"{shown or 'nothing'}); start the load nodes with ray start "
        f"--resources='{{\"{first}\": 8}}', or ask for what they offer"
    )


def server_host(engine_uri: str) -> str:
    """The host of an ``openai:URL`` engine's server.

    Raises:
        UsageError: the engine has no server (``python:``) or its URL no host.
    """
    from urllib.parse import urlsplit

    kind, _, rest = engine_uri.partition(":")
    host = urlsplit(rest).hostname if kind == "openai" else None
    if not host:
        raise UsageError(
            f"--ray-resources {NOT_SERVER} keeps the load actors off the model server's "
            f"machine, and {engine_uri!r} names no server: drop {NOT_SERVER} for it"
        )
    return host


def off_server_nodes(
    nodes: Sequence[Mapping[str, Any]], server_ips: set[str], local_ips: set[str]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """Ray's live nodes (``ray.nodes()`` entries) split into (off the server's machine, on
    it). A node is on it when its address is one of the server's addresses, or when the
    server is on loopback and the node's address is one of this machine's (``local_ips``:
    a loopback server is on the machine the driver runs on)."""
    loopback = any(ipaddress.ip_address(ip).is_loopback for ip in server_ips)
    on = server_ips | (local_ips if loopback else set())
    alive = [n for n in nodes if n.get("Alive")]
    away = [n for n in alive if str(n.get("NodeManagerAddress")) not in on]
    return away, [n for n in alive if str(n.get("NodeManagerAddress")) in on]


def _addresses(host: str) -> set[str]:
    """Every address ``host`` resolves to (UsageError when it does not)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, None)
    except OSError as exc:
        raise UsageError(
            f"--ray-resources {NOT_SERVER}: the server's host {host!r} does not resolve ({exc})"
        ) from None
    return {str(info[4][0]) for info in infos}


def _local_addresses() -> set[str]:
    """This machine's own addresses (every interface, loopback included)."""
    import psutil

    return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}


def off_server_placement(
    ray: Any, engine_uri: str, resources: Mapping[str, float]
) -> tuple[str, list[tuple[str, str]]]:
    """``not-server``: the server's host and the (node id, address) of every live node off
    its machine that offers ``resources``, for the actors to be pinned to in turn.

    Raises:
        UsageError: no server to keep off, or every node that could hold an actor is on the
            server's machine (one line, with what the nodes are).
    """
    host = server_host(engine_uri)
    away, on = off_server_nodes(ray.nodes(), _addresses(host), _local_addresses())
    fits = [
        n
        for n in away
        if all(float((n.get("Resources") or {}).get(k, 0.0)) >= v for k, v in resources.items())
    ]
    if not fits:
        where = ", ".join(sorted({str(n.get("NodeManagerAddress")) for n in on})) or "none"
        raise UsageError(
            f"--ray-resources {NOT_SERVER}: no live node off the server's machine ({host}) "
            f"can hold a load actor (nodes on it: {where}; off it: {len(away)}); add a node "
            f"that does not serve the model, or drop {NOT_SERVER}"
        )
    return host, [(str(n["NodeID"]), str(n.get("NodeManagerAddress"))) for n in fits]
