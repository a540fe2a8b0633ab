"""How long each README command takes, run as the README runs it.

Every ``gpualloc ...`` line of the README's bash blocks runs in order, in a scratch folder that holds
``examples/`` and sees ``../shared`` (as a clean checkout does), so a command that reads an earlier
command's output finds it. The service walkthrough (its ``serve ... &`` block) is measured by
``tests/service/test_walkthrough.py`` instead, and a command that needs a GPU is skipped on a machine
without one. The README quotes these times; a line whose comment says ``~N min`` or ``~N s`` is checked
against the measured time (``--check``).

    python benchmarks/readme_times.py                      # all lines (the two reproduce runs included)
    python benchmarks/readme_times.py --skip reproduce     # leave out lines containing a word

Writes ``benchmarks/results/readme_times.json`` and prints a table.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _args import Parser, output, positive

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GPU_WORDS = ("--backend nvml", "cuda:")
QUOTED = re.compile(r"~\s*([\d.]+)\s*(s|min)\b")


def readme_lines(path: Path) -> list[tuple[str, float | None]]:
    """(command, quoted seconds or None) for each ``gpualloc`` line of the README's bash blocks, leaving
    out the service block (the one that starts ``gpualloc serve``)."""
    lines = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", path.read_text(), flags=re.S):
        if "gpualloc serve" in block:
            continue
        for raw in re.sub(r"\\\n\s*", " ", block).splitlines():
            command, _, comment = raw.partition("  #")
            command = command.strip()
            if not command.startswith("gpualloc "):
                continue
            m = QUOTED.search(comment)
            quoted = None if m is None else float(m.group(1)) * (60 if m.group(2) == "min" else 1)
            lines.append((command, quoted))
    return lines


def _scratch() -> Path:
    root = Path(tempfile.mkdtemp(prefix="gpualloc-readme-"))
    work = root / "main"
    work.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples")
    (root / "shared").symlink_to((ROOT.parent / "shared").resolve())
    return work


def main(argv: list[str] | None = None) -> int:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip", action="append", default=[], help="Leave out lines containing this word.")
    ap.add_argument("--timeout", type=positive, default=3600.0, help="Seconds a line may run before it is stopped.")
    ap.add_argument("--check", action="store_true", help="Exit 1 if a line ran longer than the README says.")
    ap.add_argument("--out", type=output, default=RESULTS / "readme_times.json")
    args = ap.parse_args(argv)

    gpualloc = Path(sys.executable).with_name("gpualloc")
    work = _scratch()
    env = {**os.environ, "COLUMNS": "100"}
    rows = []
    for command, quoted in readme_lines(ROOT / "README.md"):
        if any(word in command for word in GPU_WORDS) or any(word in command for word in args.skip):
            rows.append({"command": command, "quoted_s": quoted, "wall_s": None, "rc": None, "skipped": True})
            continue
        argv_ = [str(gpualloc), *shlex.split(command)[1:]]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(argv_, cwd=work, env=env, capture_output=True, timeout=args.timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = 124
        wall = time.perf_counter() - t0
        rows.append({"command": command, "quoted_s": quoted, "wall_s": round(wall, 2), "rc": rc, "skipped": False})
        print(f"{wall:8.1f} s  rc={rc}  {command[:100]}", file=sys.stderr, flush=True)
    shutil.rmtree(work.parent, ignore_errors=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"machine": os.uname().nodename, "cpus": os.cpu_count(), "rows": rows,
              "total_s": round(sum(r["wall_s"] or 0 for r in rows), 1)}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| wall s | quoted | rc | command |\n|---:|---:|---:|---|")
    for r in rows:
        wall = "skipped" if r["skipped"] else f"{r['wall_s']:.1f}"
        quoted = "" if r["quoted_s"] is None else f"{r['quoted_s']:.0f}"
        print(f"| {wall} | {quoted} | {r['rc'] if r['rc'] is not None else ''} | `{r['command']}` |")
    print(f"total {result['total_s']} s on {result['cpus']} CPUs -> {args.out}")
    failed = [r for r in rows if r["rc"] not in (0, None)]
    over = [r for r in rows if r["quoted_s"] is not None and r["wall_s"] is not None and r["wall_s"] > r["quoted_s"]]
    for r in failed:
        print(f"failed (rc {r['rc']}): {r['command']}", file=sys.stderr)
    for r in over:
        print(f"longer than quoted ({r['wall_s']} s > {r['quoted_s']} s): {r['command']}", file=sys.stderr)
    return 1 if failed or (args.check and over) else 0


if __name__ == "__main__":
    sys.exit(main())
