"""Hybrid data × pipeline × tensor parallel plans (``gpualloc-plan`` v2): plan, cost, simulation, search."""
