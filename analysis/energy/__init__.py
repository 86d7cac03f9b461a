"""Energy join: telemetry samples × steps and requests → energy per run, phase, request, token.

The package is split by concern:

- :mod:`~perfscope.analysis.energy.curves`: a device's cumulative energy E(t), by its
  ``counter`` (NVML's total-energy counter or RAPL, linear between the samples where it
  changed) or ``integrated`` from power samples (trapezoid rule), and energy over windows;
- :mod:`~perfscope.analysis.energy.attribution`: the window split into phases and requests
  (by steps, or by the requests in flight for HTTP engines);
- :mod:`~perfscope.analysis.energy.devices`: per device and node, peak power, memory,
  throttling, the host CPU and the measured GPU counters;
- :mod:`~perfscope.analysis.energy.section`: :func:`energy_section`, which joins them into the
  :class:`~perfscope.analysis.summary.Energy` record.

The counter is preferred wherever every headline device has one; the method is named in the
result. Headline devices are the GPUs when GPU telemetry exists, else the CPU packages (RAPL),
else energy is ``unavailable`` with the reason — never estimated from TDP.

The whole-run window is the measured window (first non-warmup send to the last token). With
steps (local engines) a phase's energy is the sum over its step windows, the rest of the window
is ``between_steps``, and each step's energy is split among its requests by tokens (decode: one
each; prefill: prompt lengths; mixed: equally). Without steps (HTTP engines), every moment's
energy is split equally among the requests in flight, and counted as prefill before a
request's first token and decode after it.
"""

from __future__ import annotations

from perfscope.analysis.energy.curves import EnergyCurve
from perfscope.analysis.energy.devices import THROTTLE_REASONS, device_keys
from perfscope.analysis.energy.section import energy_section

__all__ = ["THROTTLE_REASONS", "EnergyCurve", "device_keys", "energy_section"]
