"""gwtf.node: the real node process, its control plane over gRPC (DESIGN.md 3).

One process holds one pipeline stage and runs one `gwtf.flow.decentralized.FlowNode`, driven by
real messages. Modules, one idea each (pure ones first; only `server`, `transport` and `node` do
I/O):

    config      NodeConfig (every timeout, with why), SwarmSettings (what the first node decides
                and every joiner receives), the FlowConfig they imply
    wan         the emulated WAN: per-peer delay = queueing + size/bandwidth + one-way latency
    membership  member table, gossip merge, failure detector (heartbeat silence + refused calls)
    links       link estimates (windowed min RTT, windowed max bandwidth), arc capacity and cost
                with the formulas of gwtf.flow.topology, hysteresis
    driver      FlowDriver: the FlowNode, per-peer outboxes (latest state per arc), arc
                announcements, pipelined calls and retransmission, the phase state and the
                quiet/activity report
    phases      PhaseDetector: ends scaling phases swarm-wide (two identical waves, all quiet)
    codec       protobuf <-> dataclasses, and validation of everything a peer sends
    transport   channel options (keepalive, sizes), one channel per peer, WAN and malformed-
                request interceptors
    server      the gRPC servicers (membership, probe, flow, status, health), thin
    prober      LinkProber: when and what to measure on the arcs a node owns
    coordinator PhaseCoordinator: the waves and nudges of the phase detection, in asyncio
    node        Node: the asyncio orchestration of all the above, host of prober and coordinator
    cli         `gwtf node`;  launch: `gwtf launch`

The import arrows: cli -> node -> server/transport/prober/coordinator -> driver/membership/
links/phases/wan -> gwtf.flow.
Nothing here imports torch, except `measure_compute` when a node measures its own speed.
"""
