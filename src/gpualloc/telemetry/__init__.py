"""What the machines are doing now: one telemetry interface for simulated and real backends.

``base.py`` defines the samples and the two interfaces, and imports nothing from the rest of
gpualloc but its errors, so the placement layer can consume samples without depending on a backend:

* :class:`~gpualloc.telemetry.base.TelemetrySource`: one training step (per device, per link); the
  placement simulator's source is :class:`gpualloc.placement.replan.SimulatedTelemetry`.
* :class:`~gpualloc.telemetry.base.DeviceTelemetry`: a device monitor, one
  :class:`~gpualloc.telemetry.base.DeviceRecord` per device per sample. Backends (registry in
  ``backends.py``): ``nvml.py`` (real GPUs; the only import of pynvml), ``sim.py`` (the cluster and
  placement simulators), ``replay.py`` (a recorded Parquet/CSV file, and the recorder).

``exporter.py`` serves device records to Prometheus under NVIDIA DCGM exporter names. Fields a
backend cannot read are None everywhere, never 0. See ``docs/telemetry.md``.
"""
