"""What things cost: op time on a device, link time, power; calibrated on measured data."""

from gpualloc.cost.model import Calibration, CostModel, Efficiency

__all__ = ["Calibration", "CostModel", "Efficiency"]
