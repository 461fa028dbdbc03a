"""The discrete-event simulator (`gwtf simulate`): scenarios, churn traces, routing policies.

- `engine`: the heapq event loop; `scenario`: TOML scenario files; `traces`: churn traces;
- `simulator`: the core for one policy (compute, links, injection, iterations, commit), with
  `entities` (nodes, microbatches, the iteration, the result), `churn` (joins, leaves, crashes,
  moves), `recovering` (the crash rules, SWARM's losses, dtfm's restarts), `shipping` (partial
  sums, docs/design.md 4.9), `network` and `costs` around it;
- `policies` and `baselines`: gwtf, oracle, swarm, swarm-rebalance, dtfm;
- `report`: JSON, CSV and PNG outputs; `cli`: the command (runs a scenario's policies).
"""
