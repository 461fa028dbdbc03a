"""`python -m benchmarks.own_sites`: why unlocated nodes share one site until measured.

A node without `--location` whose links no one measured shares one site with the others; once a
report involves it, it is a site of its own (docs/design.md 2.12, *Measured links*), a cell of
one node in the solve. This times one `LocalRoute.solve` of N routing-only nodes in
4 stages (compute times 0.05-0.2 s, seed 0) with every node at one site, then with every node a
site of its own and every site pair joined by the intra-location link, in the same process:
the same flow, and the ratio of the times.
"""

from __future__ import annotations

import random
import sys
import time

from gwtf.flow.linkreports import SiteLinks
from gwtf.flow.localroute import LocalRoute
from gwtf.flow.topology import DEFAULT_INTRA, NodeSpec


def solve_s(nodes: list[NodeSpec], repeat: int = 3) -> tuple[float, int]:
    best, through = float("inf"), 0
    for _ in range(repeat):
        route = LocalRoute(nodes[0].id, 4, 8 * 2**20, {}, DEFAULT_INTRA, quiet_s=0.0,
                           clock=time.perf_counter)  # fmt: skip
        route.set_view(nodes, SiteLinks({}, {}, DEFAULT_INTRA))
        start = time.perf_counter()
        while not route.solve():
            start = time.perf_counter()
        best = min(best, time.perf_counter() - start)
        through = route.throughput()
    return best, through


def main() -> int:
    print("| nodes | one site (s) | a site per node (s) | ratio | same units through s0n000 |")
    print("|---|---|---|---|---|")
    for n in (int(a) for a in (sys.argv[1:] or ["64", "128", "256"])):
        rng = random.Random(0)
        plan = [(f"s{k}n{i:03d}", k, 0.1 * rng.uniform(0.5, 2)) for k in range(4)
                for i in range(n // 4)]  # fmt: skip
        one, f1 = solve_s([NodeSpec.make(i, k, c, "one-site") for i, k, c in plan])
        own, f2 = solve_s([NodeSpec.make(i, k, c, f"@{i}") for i, k, c in plan])
        print(f"| {n} | {one:.3f} | {own:.3f} | {own / one:.1f} | {f1 == f2} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
