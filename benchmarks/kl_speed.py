"""KL bisection speed and cut: gpualloc's kl_bisect vs networkx kernighan_lin_bisection vs pymetis.

Random graphs with locality (each node joins ~4 nodes at geometrically distributed index distance,
plus 1% random long edges), random positive edge weights, unit node weights, k = 2. All three are
scored with the same objective: total weight of the cut edges (pymetis gets weights scaled to ints).
networkx is skipped above --nx-max-nodes (default 10k: at 100k it takes many minutes).

    python benchmarks/kl_speed.py [--sizes 1000 10000 100000] [--nx-max-nodes 10000] [--seed 0]

Writes benchmarks/results/kl_speed.json and prints a table.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

import _args
from gpualloc.placement.partition.kernighan_lin import kl_bisect, to_csr

OUT = Path(__file__).resolve().parent / "results" / "kl_speed.json"


def random_graph(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    src = np.repeat(np.arange(n), 4)
    dst = (src + rng.geometric(0.3, src.size)) % n
    extra = rng.integers(0, n, size=(n // 100, 2))
    src = np.concatenate([src, extra[:, 0]])
    dst = np.concatenate([dst, extra[:, 1]])
    keep = src != dst
    src, dst = src[keep], dst[keep]
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    key = np.unique(lo * n + hi)
    src, dst = key // n, key % n
    return src, dst, rng.uniform(1.0, 10.0, src.size)


def cut(side: np.ndarray, src, dst, w) -> float:
    return float(w[side[src] != side[dst]].sum())


def run(n: int, nx_max: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    src, dst, w = random_graph(n, rng)
    row: dict = {"nodes": n, "edges": int(src.size)}
    adj = to_csr(n, src, dst, w)
    t = time.perf_counter()
    side = kl_bisect(adj, np.ones(n), 0.5, seed=seed)
    row["kl_s"] = time.perf_counter() - t
    row["kl_cut"] = cut(side, src, dst, w)
    row["kl_imbalance"] = abs(int(side.sum()) - n / 2) / n

    import pymetis

    indptr, indices, data = adj
    t = time.perf_counter()
    _, parts = pymetis.part_graph(2, xadj=indptr.tolist(), adjncy=indices.tolist(),
                                  eweights=np.maximum(np.rint(data * 100), 1).astype(int).tolist())
    row["metis_s"] = time.perf_counter() - t
    row["metis_cut"] = cut(np.asarray(parts) == 1, src, dst, w)

    if n <= nx_max:
        import networkx as nx
        from networkx.algorithms.community import kernighan_lin_bisection

        g = nx.Graph()
        g.add_nodes_from(range(n))
        g.add_weighted_edges_from(zip(src.tolist(), dst.tolist(), w.tolist(), strict=True))
        t = time.perf_counter()
        a, _b = kernighan_lin_bisection(g, weight="weight", seed=seed)
        row["nx_s"] = time.perf_counter() - t
        side_nx = np.zeros(n, dtype=bool)
        side_nx[list(a)] = True
        row["nx_cut"] = cut(side_nx, src, dst, w)
        row["speedup_vs_nx"] = row["nx_s"] / row["kl_s"]
        row["cut_ratio_vs_nx"] = row["kl_cut"] / row["nx_cut"]
    else:
        row["nx_note"] = f"skipped: networkx above {nx_max} nodes takes too long"
    row["time_ratio_vs_metis"] = row["kl_s"] / row["metis_s"]
    row["cut_ratio_vs_metis"] = row["kl_cut"] / row["metis_cut"]
    return row


def main() -> None:
    ap = _args.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=_args.at_least(2), nargs="+", default=[1000, 10000, 100000],
                    help="graph sizes (nodes; a bisection needs 2)")
    ap.add_argument("--nx-max-nodes", type=_args.at_least(0), default=10000)
    ap.add_argument("--seed", type=_args.seed, default=0)
    args = ap.parse_args()
    rows = [run(n, args.nx_max_nodes, args.seed) for n in args.sizes]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"benchmark": "kl_speed", "seed": args.seed, "rows": rows}, indent=2))
    print(f"{'nodes':>7} {'edges':>7} | {'kl s':>7} {'kl cut':>9} | {'nx s':>7} {'nx cut':>9} {'x faster':>8} "
          f"{'cut/nx':>6} | {'metis s':>7} {'metis cut':>9} {'cut/metis':>9}")
    for r in rows:
        nx_s = f"{r['nx_s']:7.3f} {r['nx_cut']:9.1f} {r['speedup_vs_nx']:8.1f} {r['cut_ratio_vs_nx']:6.2f}" \
            if "nx_s" in r else f"{'skipped':>7} {'-':>9} {'-':>8} {'-':>6}"
        print(f"{r['nodes']:7d} {r['edges']:7d} | {r['kl_s']:7.3f} {r['kl_cut']:9.1f} | {nx_s} | "
              f"{r['metis_s']:7.3f} {r['metis_cut']:9.1f} {r['cut_ratio_vs_metis']:9.2f}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    _args.guarded(main)
