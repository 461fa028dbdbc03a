"""The node's control plane (docs/design.md 2.7, 2.12, 3.3-3.5, 3.9): who is in the swarm and how
a node enters it, and how the flows are computed and kept.

Pure parts: the member table with its failure detector (`membership`), the flow driver around a
`FlowNode` (`driver`), the phase termination detector (`phases`), link estimates and arc
parameters (`links`). Parts with I/O: entering a swarm (`entry`), heartbeats, gossip and
verdicts (`membercontrol`), channels to peers (`peers`), the flow side with its sends and phases
(`flowcontrol`, `phasecoordinator`), link probes (`prober`) and local routing fed from the member
table (`routing`)."""
