"""Reproducible experiments behind the results tables (`gpualloc reproduce ...`)."""
