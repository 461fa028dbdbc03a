"""The job runtime on the wire (docs/design.md 3.7, 3.8, 4): what a node does for a training job
apart from the torch work.

`manager` (JobManager) is what the node and its servicers call; the jobs a node knows and the one
in hand are in `book`; a job goes from its submission to its start on every member through
`launcher`; calls in are checked in `calls`, calls out retried in `wire`; stage states move in
`transfer`; a node that joins a running job enters it through `joiner`; a partition that heals is
`heal`'s; `journals` writes what the coordinator and the ledger decide; `host` is what the
runtime needs from its node. The job's coordinator, when this node is it, is `coordinator/`."""
