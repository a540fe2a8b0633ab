"""Across jobs: the discrete-event cluster simulator, scheduling policies and metrics."""
