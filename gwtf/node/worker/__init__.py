"""The torch side of a job on a node (docs/design.md 1, 3.7, 4): `worker` (StageWorker) wires its
parts around what they share (`stage`): the compute thread (`runtime`), a microbatch's life
(`pipeline`), the data plane's sends (`sender`), this replica's two-phase commit (`commit`) with
its reduce-scatter and all-gather (`allreduce`, `slices`), its part in another node's crash and in
restarts (`recoveries`), and the running sums it ships to a stage peer (`shipping`). Only a node
that trains imports it, and with it torch."""
