"""What the machines are: device and link types (the catalog) and cluster specs."""

from gpualloc.hardware.catalog import Catalog, DeviceType, LinkType, default_catalog

__all__ = ["Catalog", "DeviceType", "LinkType", "default_catalog"]
