"""The ``gpualloc`` command line (Typer + Rich). The only place that parses configuration."""
