"""Job speeds: a jobs x device-types matrix of throughput relative to the reference device.

``speed_matrix(jobs, device_types)[i, t]`` is how many times faster job ``i`` runs on device type
``t`` than on :data:`~gpualloc.workload.jobs.REFERENCE_DEVICE` (V100-16GB), so the job's run time
there is ``work_s / speed``. It is ``1.0`` on the reference, and ``0.0`` where the job's
``gpu_types`` forbids the type (or where a measurement says the job cannot run, see below). This is
the one representation every scheduling policy speaks (as in Gavel's throughput matrix).

Rules, per job type (first that applies, column by column):

* **ml-training with a model that has measurements** -- measured ratios:

  1. a Gavel job type (``"ResNet-50 (batch size 64)"``, as in Gavel traces): the ratio of Gavel's
     measured steps/s on that device to V100 at the job's scale factor (``num_gpus``; a scale factor
     Gavel did not measure uses the 1-GPU numbers). Gavel measured V100, P100 and K80; a ``0.0`` in
     Gavel's table (ResNet-50 at batch 128 on 2+ K80s, out of memory) stays ``0.0``;
  2. the model's *family* (``"resnet50"``; see :func:`model_family`): the median over Gavel's batch
     sizes of the 1-GPU ratio (V100, P100, K80), and Sia's measured ratio (T4, V100, A100-40GB,
     RTX-2080Ti, RTX-6000): the per-sample marginal time ratio from
     :func:`gpualloc.cost.calibrate.sia_speed_ratios` where that linear fit is good (R^2 >= 0.8),
     otherwise the whole-step ratio at the largest batch both GPUs ran. Sia's ``ncf`` and ``yolov3``
     take the whole-step ratio; ``ncf``'s is large (T4 9x, A100 18x the V100) because Sia's
     V100 (Azure) nodes ran NCF host-bound -- it is what was measured, not a peak ratio.

  V100-32GB and A100-80GB use the measurements of V100-16GB and A100-40GB (same chips, more memory).
* **ml-training otherwise** (no model, or a model or device without measurements): catalog ratio of
  ``tensor_tflops`` (FP32 peak where a device has no tensor peak) to the reference's.
* **simulation**: catalog ratio of ``fp64_tflops`` (FP32 peak where missing).
* **data-processing**: catalog ratio of ``mem_bandwidth_bytes_per_s``.

Catalog ratios are **estimates** from vendor peak specs; every AMD column (MI50, MI100, ...) is such
an estimate, since no public source here measured AMD GPUs. Peak ratios spread wider than measured
ones on old GPUs (K80: tensor peak 0.035x the V100, measured ResNet-50 0.14-0.30x).

The measured numbers ship in ``data/measured_speeds.json`` (built by :func:`build_measured_speeds`
from ``../shared/data``; the file names its sources and licenses), so nothing here reads ``shared``
at run time unless ``data_root`` says so.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from gpualloc.errors import CostModelError, TraceError, write_text
from gpualloc.hardware.catalog import DeviceType, default_catalog
from gpualloc.workload.jobs import REFERENCE_DEVICE, Job, JobType

MEASURED_SPEEDS_FILE = "data/measured_speeds.json"
"""The bundled measurements, relative to the ``gpualloc.workload`` package."""

GAVEL_DEVICES: Mapping[str, str] = {"v100": "V100-16GB", "p100": "P100", "k80": "K80"}
"""Gavel's GPU keys in ``simulation_throughputs.json`` and their catalog names (Gavel, OSDI 2020, §7)."""

SIA_FAMILIES: Mapping[str, str] = {
    "bert": "bert",
    "cifar10": "resnet18",  # adaptdl's CIFAR-10 example trains ResNet-18, like Gavel's ResNet-18 job
    "deepspeech2": "deepspeech2",
    "imagenet": "resnet50",
    "ncf": "ncf",
    "yolov3": "yolov3",
}
"""Sia (and Pollux) application names and the model family each trains."""

MODEL_ALIASES: Mapping[str, str] = {
    **SIA_FAMILIES,
    "neumf": "ncf",
    "deepspeech": "deepspeech2",
}
"""Normalised model names that name a family other than themselves."""

MEASURED_EQUIVALENT: Mapping[str, str] = {"V100-32GB": "V100-16GB", "A100-80GB": "A100-40GB"}
"""Device types that use another type's measurements: same chip, more memory."""


@dataclass(frozen=True)
class SiaTraining:
    """How much training one Sia/Pollux application does, to turn step times into total work.

    Attributes:
        epochs: epochs to completion (``max_epochs`` in adaptdl's ``simulator/applications.py``).
        samples_per_epoch: training samples per epoch (the dataset's training split).
        local_bsz: per-GPU batch typical of the Pollux workloads (``batch_size / num_replicas``).
        dataset: the dataset and where its size comes from.
    """

    epochs: int
    samples_per_epoch: int
    local_bsz: int
    dataset: str


SIA_TRAINING: Mapping[str, SiaTraining] = {
    "bert": SiaTraining(2, 87_599, 32, "SQuAD v1.1 train split, 87,599 questions (fine-tuning)"),
    "cifar10": SiaTraining(100, 50_000, 341, "CIFAR-10 train split, 50,000 images"),
    "deepspeech2": SiaTraining(80, 7_924, 53, "CMU ARCTIC, 7 original speakers x 1,132 utterances "
                                              "(ESTIMATE: the speakers Pollux used are not published)"),
    "imagenet": SiaTraining(90, 1_281_167, 133, "ILSVRC-2012 train split, 1,281,167 images"),
    "ncf": SiaTraining(10, 4_970_845, 32_768, "MovieLens-1M as in adaptdl's NCF example: 994,169 "
                                               "training ratings x (1 positive + 4 sampled negatives)"),
    "yolov3": SiaTraining(50, 16_551, 16, "PASCAL VOC 2007+2012 trainval, 16,551 images"),
}
"""Per application: the training whose V100 time :func:`build_measured_speeds` estimates."""

PROVENANCE = {
    "gavel": "stanford-futuredata/gavel, scheduler/simulation_throughputs.json: training steps/s "
             "of 26 job types at scale factors 1/2/4/8 on V100, P100, K80 (isolated, key 'null')",
    "sia": "siasosp23/artifacts, sia-simulator/traces/<app>/placements-<cluster>.csv: measured step "
           "times on T4 (aws), V100 (azure), A100 (dgx-ext), RTX 2080 Ti (rtx), RTX 6000 (quad)",
    "training": "epochs from petuum/adaptdl simulator/applications.py (max_epochs); dataset sizes "
                "from the datasets' publications (see gpualloc.workload.speed.SIA_TRAINING)",
}
LICENSES = {
    "gavel": "MIT (stanford-futuredata/gavel LICENSE)",
    "sia": "Apache-2.0 (derived from petuum/adaptdl, Apache-2.0)",
}

_NON_ALNUM = re.compile(r"[^a-z0-9]+")
_GAVEL_NAME = re.compile(r"^\s*(.*?)\s*(?:\(batch size \d+\))?\s*$")


# --------------------------------------------------------------------------- building the bundle
def _gavel_section(path: Path) -> dict[str, dict[str, dict[str, float]]]:
    """``{device: {job type: {scale factor: steps/s}}}`` of isolated runs."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TraceError(f"{path}: cannot read Gavel throughputs: {err}") from err
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key, device in GAVEL_DEVICES.items():
        if key not in raw:
            raise TraceError(f"{path}: {key}: missing GPU type (expected {', '.join(GAVEL_DEVICES)})")
        table: dict[str, dict[str, float]] = {}
        for pair, cell in raw[key].items():
            m = re.fullmatch(r"\('(.+)', (\d+)\)", pair)
            if m is None or not isinstance(cell, Mapping) or "null" not in cell:
                raise TraceError(f"{path}: {key}: malformed entry {pair!r}")
            table.setdefault(m.group(1), {})[m.group(2)] = float(cell["null"])
        out[device] = {jt: dict(sorted(sf.items(), key=lambda kv: int(kv[0])))
                       for jt, sf in sorted(table.items())}
    return out


def _gavel_families(gavel: Mapping[str, Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Median over batch sizes of each family's 1-GPU speed relative to V100."""
    ratios: dict[str, dict[str, list[float]]] = {}
    ref = gavel[REFERENCE_DEVICE]
    for device, table in gavel.items():
        for job_type, by_sf in table.items():
            ref_sps = ref.get(job_type, {}).get("1", 0.0)
            if "1" not in by_sf or ref_sps <= 0:
                continue
            family = model_family(job_type)
            if family is not None:
                ratios.setdefault(family, {}).setdefault(device, []).append(by_sf["1"] / ref_sps)
    return {fam: {dev: float(np.median(v)) for dev, v in sorted(devs.items())}
            for fam, devs in sorted(ratios.items())}


def _sia_families(sia: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Sia's measured speed per family and device (marginal-time ratio, else whole-step ratio)."""
    out: dict[str, dict[str, float]] = {}
    for device, rec in sia.items():
        for app, a in rec["apps"].items():
            family = SIA_FAMILIES.get(app)
            speed = a["speed_vs_ref"] if a["used"] else a["step_speed_vs_ref"]
            if family is not None and speed is not None and speed > 0:
                out.setdefault(family, {})[device] = float(speed)
    return {fam: dict(sorted(devs.items())) for fam, devs in sorted(out.items())}


def _training_work(raw: Mapping[tuple[str, str], tuple[np.ndarray, np.ndarray]]) -> dict[str, dict[str, Any]]:
    """Per Sia application: V100 seconds of its whole training on one GPU (see :data:`SIA_TRAINING`)."""
    ref_cluster = "azure"  # Sia's V100 cluster
    out: dict[str, dict[str, Any]] = {}
    for app, spec in SIA_TRAINING.items():
        if (app, ref_cluster) not in raw:
            raise TraceError(f"sia traces: {app}: no single-GPU V100 (azure) step times")
        bsz, step = raw[(app, ref_cluster)]
        order = np.argsort(bsz)
        bsz, step = bsz[order], step[order]
        b = float(min(spec.local_bsz, bsz[-1]))  # beyond the largest measured batch: its per-sample time
        step_s = float(np.interp(b, bsz, step))
        per_sample = step_s / b
        out[app] = {
            "family": SIA_FAMILIES[app],
            "epochs": spec.epochs,
            "samples_per_epoch": spec.samples_per_epoch,
            "local_bsz": int(b),
            "v100_step_s": step_s,
            "gpu_seconds": spec.epochs * spec.samples_per_epoch * per_sample,
            "dataset": spec.dataset,
        }
    return out


def build_measured_speeds(data_root: str | Path) -> dict[str, Any]:
    """The measured-speed bundle, from the ``shared/data`` folder (Gavel and Sia measurements).

    Returns a JSON-ready dict: ``provenance``, ``license``, ``reference_device``,
    ``gavel_steps_per_s`` (``{device: {job type: {scale factor: steps/s}}}``), ``families``
    (``{family: {device: speed vs reference}}``), ``family_sources`` and ``sia_training``
    (per Sia application: epochs, samples, V100 step time and total reference GPU-seconds).
    """
    from gpualloc.cost.calibrate import read_sia_single_gpu, sia_speed_ratios

    root = Path(data_root)
    gavel_path = root / "gavel" / "simulation_throughputs.json"
    sia_root = root / "sia" / "traces"
    if not sia_root.is_dir():
        raise TraceError(f"{sia_root}: no such folder")
    gavel = _gavel_section(gavel_path)
    by_gavel = _gavel_families(gavel)
    by_sia = _sia_families(sia_speed_ratios(sia_root))
    families: dict[str, dict[str, float]] = {}
    sources: dict[str, dict[str, str]] = {}
    for fam in sorted(set(by_gavel) | set(by_sia)):
        merged = {**by_sia.get(fam, {}), **by_gavel.get(fam, {})}  # Gavel's where both measured
        families[fam] = dict(sorted(merged.items()))
        sources[fam] = {dev: ("gavel" if dev in by_gavel.get(fam, {}) else "sia") for dev in families[fam]}
    return {
        "provenance": dict(PROVENANCE),
        "license": dict(LICENSES),
        "generated_by": "gpualloc.workload.speed.write_measured_speeds('<shared>/data')",
        "reference_device": REFERENCE_DEVICE,
        "gavel_steps_per_s": gavel,
        "families": families,
        "family_sources": sources,
        "sia_training": _training_work(read_sia_single_gpu(sia_root)),
    }


def write_measured_speeds(data_root: str | Path, out: str | Path | None = None) -> Path:
    """Regenerate the bundled ``data/measured_speeds.json`` (or write to ``out``)."""
    path = Path(out) if out is not None else Path(__file__).with_name("data") / "measured_speeds.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(build_measured_speeds(data_root), indent=1, sort_keys=True) + "\n")
    return path


@functools.lru_cache(maxsize=8)
def load_measured_speeds(data_root: str | Path | None = None) -> Mapping[str, Any]:
    """The bundled measurements, or those built from ``data_root`` when given (cached)."""
    if data_root is not None:
        return build_measured_speeds(data_root)
    text = resources.files("gpualloc.workload").joinpath(MEASURED_SPEEDS_FILE).read_text()
    return json.loads(text)


# --------------------------------------------------------------------------- lookups
def model_family(model: str) -> str | None:
    """The measured family a model name belongs to, or ``None``.

    Gavel job types drop their batch size (``"ResNet-50 (batch size 64)"`` -> ``"resnet50"``); names
    are lower-cased without punctuation (``"ResNet_18"`` -> ``"resnet18"``); Sia application names
    map to the model they train (``"imagenet"`` -> ``"resnet50"``, ``"cifar10"`` -> ``"resnet18"``).
    Whether the family has measurements is up to the bundle: ``"vgg16"`` is a family without any.
    """
    m = _GAVEL_NAME.match(model)
    base = _NON_ALNUM.sub("", (m.group(1) if m else model).lower())
    if not base:
        return None
    return MODEL_ALIASES.get(base, base)


def gavel_steps_per_s(job_type: str, scale_factor: int, device: str = REFERENCE_DEVICE,
                      measured: Mapping[str, Any] | None = None) -> float | None:
    """Gavel's measured steps/s of ``job_type`` at ``scale_factor`` on ``device``.

    A scale factor Gavel did not measure for that job type falls back to its 1-GPU number (Gavel
    measured A3C, CycleGAN and Recommendation on one GPU only). ``None`` if the job type is unknown.
    """
    table = (measured or load_measured_speeds())["gavel_steps_per_s"].get(device, {})
    by_sf = table.get(job_type)
    if by_sf is None:
        return None
    return by_sf.get(str(scale_factor), by_sf.get("1"))


def _catalog_quantity(job_type: JobType, dev: DeviceType) -> float | None:
    if job_type is JobType.SIMULATION:
        return dev.fp64_tflops if dev.fp64_tflops is not None else dev.fp32_tflops
    if job_type is JobType.DATA_PROCESSING:
        return dev.mem_bandwidth_bytes_per_s
    return dev.tensor_tflops if dev.tensor_tflops is not None else dev.fp32_tflops


def catalog_speeds(job_type: JobType, device_types: Sequence[DeviceType]) -> np.ndarray:
    """Peak-spec speed of each device type relative to the reference, for one job type (an estimate)."""
    ref = next((d for d in device_types if d.name == REFERENCE_DEVICE), None) \
        or default_catalog().device(REFERENCE_DEVICE)
    ref_q = _catalog_quantity(job_type, ref)
    out = np.empty(len(device_types))
    for t, dev in enumerate(device_types):
        q = _catalog_quantity(job_type, dev)
        if q is None or ref_q is None:
            field = {JobType.SIMULATION: "fp64_tflops", JobType.DATA_PROCESSING: "mem_bandwidth_bytes_per_s"}
            raise CostModelError(f"device {dev.name if q is None else ref.name}: "
                                 f"{field.get(job_type, 'tensor_tflops')}: needed for the speed of "
                                 f"{job_type.value} jobs, but unset")
        out[t] = q / ref_q
    return out


class _SpeedRows:
    """Computes one matrix row per distinct (job type, model, num_gpus, gpu_types) key."""

    def __init__(self, device_types: Sequence[DeviceType], measured: Mapping[str, Any]):
        self.names = [d.name for d in device_types]
        self.measured_as = [MEASURED_EQUIVALENT.get(n, n) for n in self.names]
        self.catalog = {jt: catalog_speeds(jt, device_types) for jt in JobType}
        self.gavel = measured["gavel_steps_per_s"]
        self.families = measured["families"]
        self.measured = measured

    def row(self, job_type: JobType, model: str, num_gpus: int, gpu_types: tuple[str, ...]) -> np.ndarray:
        row = self.catalog[job_type].copy()
        if job_type is JobType.ML_TRAINING and model:
            done = np.zeros(len(row), dtype=bool)
            ref_sps = gavel_steps_per_s(model, num_gpus, REFERENCE_DEVICE, self.measured)
            if ref_sps is not None and ref_sps > 0:
                for t, dev in enumerate(self.measured_as):
                    sps = gavel_steps_per_s(model, num_gpus, dev, self.measured)
                    if sps is not None:
                        row[t], done[t] = sps / ref_sps, True
            fam = self.families.get(model_family(model) or "", {})
            for t, dev in enumerate(self.measured_as):
                if not done[t] and dev in fam:
                    row[t] = fam[dev]
        if gpu_types:
            allowed = set(gpu_types)
            row[[n not in allowed for n in self.names]] = 0.0
        return row


def speed_matrix(jobs: Sequence[Job], device_types: Sequence[DeviceType],
                 data_root: str | Path | None = None) -> np.ndarray:
    """Throughput of each job on each device type relative to the reference device (module docstring).

    Args:
        jobs: the jobs (rows).
        device_types: the device types (columns), e.g. ``cluster.device_types``.
        data_root: build the measurements from this ``shared/data`` folder instead of the bundle.

    Returns:
        ``float64`` array of shape ``(len(jobs), len(device_types))``.

    Raises:
        CostModelError: a device type lacks the peak its jobs' rule needs.
    """
    rows = _SpeedRows(device_types, load_measured_speeds(None if data_root is None else str(data_root)))
    keys: dict[tuple, int] = {}
    index = np.empty(len(jobs), dtype=np.int64)
    for i, job in enumerate(jobs):
        key = (job.job_type, job.model, job.num_gpus, job.gpu_types)
        k = keys.get(key)
        if k is None:
            k = keys[key] = len(keys)
        index[i] = k
    table = np.empty((len(keys), len(device_types)))
    for key, k in keys.items():
        table[k] = rows.row(*key)
    return table[index] if len(jobs) else np.zeros((0, len(device_types)))


def measured_models() -> tuple[str, ...]:
    """Model families with measured speeds in the bundle (what the synthetic generator draws from)."""
    return tuple(sorted(load_measured_speeds()["families"]))


def mean_speed(speeds: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """Per job, the speed of a GPU drawn uniformly from a cluster with ``counts[t]`` GPUs of type ``t``."""
    w = np.asarray(counts, dtype=float)
    if w.sum() <= 0 or not math.isfinite(w.sum()):
        raise TraceError(f"cluster: expected a positive GPU count, got {list(counts)}")
    return speeds @ (w / w.sum())
