"""The node's refusals: a call it will not serve, by the reason why; and `NodeError`, a problem
the user must fix before the node can run.

Domain code (the job runtime, the data plane, membership, flows) raises one of the `Refusal`
classes below with one sentence; it names no gRPC status. The RPC edge (`gwtf.node.rpc.edge`,
used by the servicers in `gwtf.node.rpc.server` and by the data plane's in
`gwtf.node.dataplane.tensors`) holds the one table from class to status code (docs/design.md 3.2). A
malformed message is `gwtf.node.rpc.codec.InvalidMessage` instead (INVALID_ARGUMENT, in the same
table).
"""

from __future__ import annotations

__all__ = [
    "Busy",
    "CannotRun",
    "IdTaken",
    "InvalidOrder",
    "Mismatch",
    "NodeError",
    "NotHeld",
    "NotParticipant",
    "NotReady",
    "Refusal",
    "StaleIteration",
    "Stranger",
    "Superseded",
    "UnknownJob",
    "WrongState",
]


class NodeError(Exception):
    """A problem the user must fix (one sentence), with the exit code it deserves."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Refusal(Exception):
    """The node refuses a call for a reason the caller must act on; the subclass says which,
    `message` (one sentence) says what happened. It names no status code: the RPC edge's table
    does."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotReady(Refusal):
    """This node cannot serve the call now but may soon: it is not serving yet, it enters the
    job or takes it over, the job has not started here, its view of the coordinator is behind,
    or it failed for a moment. The same call may pass later."""


class Busy(Refusal):
    """This node cannot take the work now (no memory slot, no free microbatch): the sender may
    try again, or another node."""


class NotParticipant(Refusal):
    """This node holds no part, or not the role the call is for, in the job: it does not take
    part, does not coordinate it, has not prepared it, or is still entering it."""


class WrongState(Refusal):
    """The job here is not in the state the call needs: it is not running, or another job
    runs (one job at a time)."""


class NotHeld(Refusal):
    """This node does not hold what the call asks for: a stage's state or weights, a snapshot,
    a kept activation, a microbatch that never came here."""


class StaleIteration(Refusal):
    """The call is about an iteration (or a commit attempt of one) this node is not at: one it
    is past, cannot reach from where it is, or did not prepare."""


class Mismatch(Refusal):
    """The call does not fit this swarm or this job: a stage outside the swarm, state of
    another iteration than the one asked for."""


class Stranger(Refusal):
    """The caller is not one this node serves: another swarm's node, or not a live member."""


class CannotRun(Refusal):
    """The job cannot run as submitted: a stage with no live node, a node that takes no
    training work, state or data that do not build the stage, a participant that failed to
    prepare or start it."""


class InvalidOrder(Refusal):
    """The call asks for something that cannot be: a microbatch the job lacks, a recovery or a
    redirect that names the wrong nodes, a phase command beyond what a scaling has."""


class UnknownJob(Refusal):
    """This node knows no job of that id."""


class IdTaken(Refusal):
    """A joiner's id is this node's, or a live member's, or known from a more recent
    incarnation."""


class Superseded(Refusal):
    """Another call changed what this one was working on meanwhile (another job arrived)."""
