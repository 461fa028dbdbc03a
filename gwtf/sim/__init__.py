"""The discrete-event simulator (`gwtf simulate`): scenarios, churn traces, routing policies.

- `engine`: the heapq event loop; `scenario`: TOML scenario files; `traces`: churn traces;
- `simulator`: the core for one policy (compute, links, injection, iterations, commit), with
  `entities` (nodes, microbatches, the iteration, the result), `churn` (joins, leaves, crashes,
  moves), `paces` (each node's pace, for the policies that follow it), `recovery/` (the crash
  rules, SWARM's losses, dtfm's restarts, shipped partial sums, stage snapshots, the client's
  checkpoints), `network`, `exchange` and `costs` around it;
- `policies`: gwtf, oracle, swarm, swarm-rebalance, swarm-routing, dtfm, with `routing/` (how
  each routes), and `compression` (what each sends across a stage boundary where a scenario
  compresses: the bytes, the codecs' compute, the plan);
- `report`: JSON, CSV and PNG outputs; `cli`: the command (runs a scenario's policies).
"""
