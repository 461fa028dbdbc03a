"""gwtf.node: the real node process (docs/design.md 3): one process holds one pipeline stage, runs
one `gwtf.flow` routing state machine on real messages and, while a job trains, its stage of the
model.

The node is two drivers of the pure cores put together, in packages that name its parts:

    rpc/        the wire: servicer tables, the one refusal -> status table (edge), codec and
                validation of everything a peer sends, channels and interceptors (transport),
                the emulated WAN, security, rate limits, the one retry policy, chunked streams
    control/    the control plane: the member table and failure detector, entering a swarm,
                heartbeats and gossip (membercontrol), the flow driver and its phases
                (flowcontrol, driver, phases, phasecoordinator), link probes and arc parameters,
                local routing from the member table
    jobs/       the job runtime on the wire: the manager the servicers call, submissions and
                starts (launcher), calls in and out, joiners, partitions healed, state transfer,
                journals; coordinator/ is the job coordinator (commit, crash recovery, entrance,
                quorum, moves) driving `gwtf.job.iterations`
    worker/     the torch side of a job (imported only by a node that trains): the compute
                runtime, the microbatch pipeline, the data-plane sender, the commit participant
                and its all-reduce, recoveries, shipping of running sums
    dataplane/  microbatch tensors and gradient sums as checked chunked streams

and, at the top, what every part shares: `node` (Node: builds and wires the parts, runs the
lifecycle), `config` (NodeConfig: every timeout, with its reason; SwarmSettings), `settings`
(the `gwtf node` flags), `state` (NodeState), `status` (`Status.Get` and the metrics snapshot),
`observe` (logs and Prometheus), `errors` (refusals and NodeError), `faults` (fault injection),
`stalls` (the share of the time the process runs at all) and `cli` (`gwtf node`). Local swarms
of node processes (`gwtf launch`, churn replay, the demo) are `gwtf.local`'s.

The import arrows: cli -> node -> control, jobs, rpc; jobs -> jobs.coordinator -> gwtf.job ->
gwtf.recovery; control -> gwtf.flow; jobs -> worker (lazily) -> dataplane -> gwtf.train.
Importing the node imports no torch: a node that trains loads `worker` (and torch) before it
enters its swarm, one that does not (`--no-train`) never does.
"""
