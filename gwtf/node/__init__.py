"""gwtf.node: the real node process, its control plane over gRPC (docs/design.md 3).

One process holds one pipeline stage and runs one `gwtf.flow.decentralized.FlowNode`, driven by
real messages. Modules, one idea each (pure ones first; only `server`, `transport`, `peers`,
`entry`, `flows`, `control`, `status` and `node` do I/O):

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
    errors      Refusal and its classes: a call the node will not serve, by the reason why
                (no gRPC status: that is the edge's)
    rpcedge     the one table from refusal class to gRPC status code, the drain of a refused
                stream (the servicers and the data plane's use it)
    plan        NodePlan: a node to start on this machine (launch, churn replay, demo)
    jobhost     JobsHost: what the job runtime needs from its node
    transport   channel options (keepalive, sizes), one channel per peer, WAN and malformed-
                request interceptors
    server      the gRPC servicers (membership, probe, flow, status, health), thin
    prober      LinkProber: when and what to measure on the arcs a node owns
    coordinator PhaseCoordinator: the waves and nudges of the phase detection, in asyncio
    faults      fault injection for chaos tests: SIGKILL at a chosen point, or a replica that
                poisons its stage (--fault)
    security    the swarm's token (a server interceptor, constant-time) and mutual TLS
    ratelimit   a token bucket per peer and per host (--rate-limit), an interceptor
    observe     logs (text or JSON lines, with job/iteration/microbatch ids) and the Prometheus
                exposition (the control plane's snapshot, the job runtime's families)
    jobcoord    JobCoordinator: the coordinator's calls: commit phases, the watchdog, joiners,
                and a new coordinator taking over
    jobrecover  CrashRecovery: the coordinator's crash recovery with gwtf.recovery (evidence,
                kept sums, plan_crash, recoveries and keep orders)
    jobs        JobManager: the job runtime as the node and its servicers see it, and the
                job's life (iterations completed, exclusions, failure, members down, take-over)
    jobstate    JobBook: every job's progress and the job in hand (CurrentJob)
    jobprep     JobLauncher: torch loaded once, a job read, submitted, prepared and started
    jobcalls    JobCalls: the coordinator's and participants' calls, checked
    jobwire     JobWire: retried calls, progress and failures spread, reports to the coordinator
    jobtransfer StateTransfer: stage states to joiners, backups, resumes, final weights
    jobjoin     Joiner: entering a running job, adopting one whose holders all died
    moves       MovePlanner: the coordinator names a move of a node between stages in a step;
                leave_for: the mover leaves for its new stage (gwtf node starts its new
                incarnation)
    worker      StageWorker: the torch side of a job on a node: compute queue, memory slots,
                forward and backward over the data plane, the ledger and kept tensors, carrying
                out recoveries, the commit with the stage's replicas; it wires its parts:
                stage (the state they share), runtime (the compute thread), pipeline (the
                microbatches' life), sender (the data plane's sends), commit (this replica's
                commit), recoveries (and restarts, and adopting a kept sum), shipping (its
                running sum to a stage peer, bounded replay)
    chunks      chunked streams: cutting buffers into chunk payloads, checking a stream coming in
                (the data plane, the gradient sums and state transfer share it)
    gradsync    replicas' gradient sums as a chunked stream, checked
    tensors     the data plane: microbatch tensors as chunked streams, checked
    settings    NodeSettings: the `gwtf node` flags
    state       NodeState: what the parts of a node share (id, swarm, members, driver, tasks)
    peers       Peers: one channel per peer, the emulated WAN, the flow sends' backoff
    entry       SwarmEntry: creating or joining a swarm
    flows       FlowControl: arcs, flow sends, phases; host of prober and coordinator
    control     MembershipControl: heartbeats, gossip, what a membership change means
    status      StatusReport: `Status.Get` and the metrics snapshot
    node        Node: builds and wires all the above and runs the lifecycle
    cli         `gwtf node`;  launch: `gwtf launch` (and the nodes' die-with-launcher);
                churn: `gwtf launch --churn`, replaying a trace

The import arrows: cli -> node -> control -> flows/status -> state/peers/prober/coordinator ->
driver/membership/links/phases/wan -> gwtf.flow; node -> entry, server, jobs; jobs -> jobcoord
-> gwtf.job (the pure job protocol: the coordinator's bookkeeping, next hops) -> gwtf.recovery;
jobs -> worker (lazily) -> tensors/gradsync -> gwtf.train, gwtf.recovery.
Importing the node imports no torch: a node that trains loads `worker` (and torch) before it
enters its swarm, one that does not (`--no-train`) never does.
"""
