"""What a simulated swarm does about work that died (docs/design.md 4, 5): the crash rules,
SWARM's losses and dtfm's restarts (`recovering`), shipped running sums (`shipping`), stage
snapshots and rollbacks (`snapshots`) and the client's checkpoints (`clientcopy`)."""
