"""gwtf.job: the job protocol, pure (no I/O, no clock, no asyncio, grpc or torch).

What a training job's nodes decide, written once so that every driver decides it the same way:

    iterations  IterationCoordinator: an iteration's plan (the holders' shares, `assign`), its
                two-phase commit, the recoveries and drops it waits for, restarts of a round,
                joiners and the exclusion of bad replicas, as the job's coordinator sees them
    microbatches  MicrobatchTable: what a node holds of the iteration in progress (forwards,
                gradients, paths, modes, losses), and the checks of an incoming microbatch's tag
    nexthop     next hops: the weights of the next-stage candidates (from the flows once they
                are settled, else from capacities) and smooth weighted round-robin over them
    quorum      the split-brain rule: a commit needs a strict majority of the last commit's
                members that are not shown dead, so at most one side of a partition commits
    slicing     the slices of a stage's commit exchange (reduce-scatter, all-gather) and the
                gaps a rerun moves
    exchange    which gradient exchange a stage's commit uses: all to all or by slices
    snapshots   stage snapshots and rollbacks: which boundaries are snapshotted, who sends a
                stage's snapshot and who keeps it, what a wiped stage is restored from
    catchup     whether a joiner whose state went stale fetches the steps it missed or the
                whole state again
    roster      who takes part: the nodes per stage, the fit of a start, the coordinator's
                successor, the last replica of a stage
    journal     the coordinator's inputs and decisions as a journal, and its replay

The node (gwtf.node) drives these over gRPC and wall time. Nothing here imports gwtf.node,
gwtf.sim or gwtf.train; the arrows point job -> recovery, flow.
"""
