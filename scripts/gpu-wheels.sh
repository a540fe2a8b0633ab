#!/usr/bin/env bash
# Download, here, the wheels that scripts/gpu-check.sh installs on the GPU machine (Python 3.12 there, whose image
# has torch, numpy, scipy, pandas, networkx, nvidia-ml-py, prometheus-client, pytest and hypothesis but not these).
# .whl/ is ignored by git (.git/info/exclude) and travels with the device call's `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .whl
for spec in pydantic==2.14.4 pydantic_core==2.50.5 annotated-types typing-inspection==0.4.5 typing_extensions \
            pymetis==2025.2.2 kahip==3.25 gymnasium==1.4.0 farama-notifications typer==0.29.2 click==8.5.1 rich==15.0.0; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_28_x86_64 -d .whl "$spec"
done
du -sh .whl
