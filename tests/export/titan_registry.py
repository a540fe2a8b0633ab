"""A torchtitan ``config_registry`` module whose config holds torchtitan's own ``[parallelism]`` and ``[training]``
sections, so its ``ConfigManager`` parses an export on a CPU-only torch (torchtitan 0.3.0's ``Trainer.Config``
imports ``triton``, which a CPU torch does not bring)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torchtitan.config import ParallelismConfig, TrainingConfig


@dataclass(kw_only=True)
class ExportSections:
    """The sections ``gpualloc export --to torchtitan`` writes, as torchtitan's dataclasses."""

    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    hf_assets_path: str = "."  # read by ConfigManager._validate_config


def gpualloc_export() -> ExportSections:
    return ExportSections()
