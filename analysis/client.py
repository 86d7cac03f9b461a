"""The HTTP client's own account of a run (``manifest.engine.config.client``): what it cost
(CPU seconds, peak RSS), which clock stamped its chunks, and how long it stalled.

Only engines that talk to a server over HTTP (``openai:``) write that record; for the others
the section is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perfscope.analysis.manifest import RunManifest, manifest_view

__all__ = ["client_section"]


def client_section(manifest: Mapping[str, Any] | RunManifest) -> dict[str, Any] | None:
    """The ``client`` summary section, or None when the engine kept no client record.

    Keys: ``cpu_s`` (the client's CPU seconds over the serve loop), ``peak_rss_bytes``
    (its peak resident set, bytes), ``stamp_clock`` (``kernel`` when chunks carry the
    kernel's receive time, ``user`` when they were stamped in user space, ``mixed``),
    ``stall`` (the stall record: threshold, worst and p99 gap between a chunk's arrival and
    its read in seconds, requests affected) when the client measured one.
    """
    client = manifest_view(manifest).engine.config.client
    if client is None:
        return None
    out: dict[str, Any] = {
        "cpu_s": client.get("cpu_s"),
        "peak_rss_bytes": client.get("peak_rss_bytes"),
        "stamp_clock": client.get("stamp_clock"),
    }
    stall = client.get("stall")
    if isinstance(stall, Mapping):
        out["stall"] = dict(stall)
    return out
