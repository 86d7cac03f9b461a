"""The HTTP client's own account of a run (``manifest.engine.config.client``): what it cost
(CPU seconds, peak RSS), which clock stamped its chunks, and how long it stalled.

Only engines that talk to a server over HTTP (``openai:``) write that record; for the others
the section is None.
"""

from __future__ import annotations

from collections.abc import Mapping

from perfscope.analysis.manifest import RunManifest, manifest_view
from perfscope.analysis.summary import Client
from perfscope.jsontypes import json_int, json_number, json_str

__all__ = ["client_section"]


def client_section(manifest: Mapping[str, object] | RunManifest) -> Client | None:
    """The ``client`` summary section (:class:`~perfscope.analysis.summary.Client`: CPU
    seconds over the serve loop, peak RSS in bytes, the clock that stamped the chunks, the
    stall record), or None when the engine kept no client record."""
    client = manifest_view(manifest).engine.config.client
    if client is None:
        return None
    stall = client.get("stall")
    return Client(
        cpu_s=json_number(client.get("cpu_s")),
        peak_rss_bytes=json_int(client.get("peak_rss_bytes")),
        stamp_clock=json_str(client.get("stamp_clock")),
        stall=dict(stall) if isinstance(stall, Mapping) else None,
    )
