"""Capture: clock, records, recorder, engines, workloads and drivers, telemetry, run store."""
