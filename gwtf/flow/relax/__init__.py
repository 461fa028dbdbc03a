"""The routing by asynchronous epsilon-relaxation (docs/design.md 2.3-2.7, `--routing relax`): a
node's flow state machine (`decentralized`, FlowNode), the swarm-wide rules of driving a whole
swarm of them (`swarm`, FlowSwarm) and the in-process message bus that runs them for `gwtf route
--method relax`, the tests and the benchmarks (`bus`). The default routing solves locally on
gossiped records instead (gwtf.flow.localroute, 2.12)."""
