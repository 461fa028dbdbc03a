"""The routing, pure and deterministic (docs/design.md 2): the swarm as a layered network
(`topology`: nodes, links, arc capacities and costs; `generate`: synthetic swarms), the objective
(`balance`), the solvers (`simplex`: networkx's min-cost flow, faster, same answer; `localsolve`:
the exact solve on grouped records; `oracle`: the centralized optimum), a node's routing by local
solves on gossiped records (`localroute`, `gossip`, `linkreports`), placement of nodes on stages
(`placement`), a node's pace measured on every microbatch (`pace`), flows read back as results
(`solution`) and `gwtf route` (`route_cli`). The relaxation, the alternative routing, is
`relax/`."""
