"""The discrete-event simulator (`gwtf simulate`): scenarios, churn traces, routing policies.

- `engine`: the heapq event loop; `scenario`: TOML scenario files; `traces`: churn traces;
- `simulator`: compute, links, iterations, churn and recovery for one policy;
- `policies` and `baselines`: gwtf, oracle, swarm, swarm-rebalance, dtfm;
- `report`: JSON, CSV and PNG outputs; `cli`: the command (runs a scenario's policies).
"""
