"""What the machines are doing now: one telemetry interface for simulated and real backends.

``base.py`` defines the samples (per device, per link, per training step) and the
:class:`~gpualloc.telemetry.base.TelemetrySource` protocol. It imports nothing from the rest of
gpualloc, so the placement layer can consume samples without depending on any backend. The
placement simulator's source is :class:`gpualloc.placement.replan.SimulatedTelemetry`; real
hardware backends (NVML) implement the same protocol, and fields a backend cannot read are None.
"""
