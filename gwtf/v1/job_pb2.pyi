from gwtf.v1 import node_pb2 as _node_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PREPARING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_COMPLETED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PREPARING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_COMPLETED: JobState
JOB_STATE_FAILED: JobState

class SubmitRequest(_message.Message):
    __slots__ = ("job_json", "resume_iteration")
    JOB_JSON_FIELD_NUMBER: _ClassVar[int]
    RESUME_ITERATION_FIELD_NUMBER: _ClassVar[int]
    job_json: str
    resume_iteration: int
    def __init__(self, job_json: _Optional[str] = ..., resume_iteration: _Optional[int] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class RouteCount(_message.Message):
    __slots__ = ("path", "microbatches")
    PATH_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    path: _containers.RepeatedScalarFieldContainer[str]
    microbatches: int
    def __init__(self, path: _Optional[_Iterable[str]] = ..., microbatches: _Optional[int] = ...) -> None: ...

class JobProgress(_message.Message):
    __slots__ = ("job_id", "name", "state", "iterations", "iterations_completed", "loss", "param_checksum", "throughput_mb_s", "dropped_microbatches", "error", "microbatches_trained", "elapsed_s", "coordinator", "job_json", "routes", "checksum_mismatches", "iteration_s", "crashes", "leaves", "joins", "rerouted_microbatches", "replayed_microbatches", "replayed_s", "compute_s", "dropped", "lost_microbatches", "restarts", "paused", "paused_s", "excluded", "resumed_from", "rollbacks", "moves", "kept_microbatches")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    PARAM_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_MB_S_FIELD_NUMBER: _ClassVar[int]
    DROPPED_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_TRAINED_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    JOB_JSON_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    ITERATION_S_FIELD_NUMBER: _ClassVar[int]
    CRASHES_FIELD_NUMBER: _ClassVar[int]
    LEAVES_FIELD_NUMBER: _ClassVar[int]
    JOINS_FIELD_NUMBER: _ClassVar[int]
    REROUTED_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    LOST_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PAUSED_S_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_FIELD_NUMBER: _ClassVar[int]
    ROLLBACKS_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    KEPT_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    state: JobState
    iterations: int
    iterations_completed: int
    loss: _containers.RepeatedScalarFieldContainer[float]
    param_checksum: str
    throughput_mb_s: float
    dropped_microbatches: int
    error: str
    microbatches_trained: int
    elapsed_s: float
    coordinator: str
    job_json: str
    routes: _containers.RepeatedCompositeFieldContainer[RouteCount]
    checksum_mismatches: int
    iteration_s: _containers.RepeatedScalarFieldContainer[float]
    crashes: int
    leaves: int
    joins: int
    rerouted_microbatches: int
    replayed_microbatches: int
    replayed_s: float
    compute_s: float
    dropped: _containers.RepeatedCompositeFieldContainer[IterationMicrobatches]
    lost_microbatches: int
    restarts: int
    paused: str
    paused_s: float
    excluded: _containers.RepeatedCompositeFieldContainer[Exclusion]
    resumed_from: int
    rollbacks: _containers.RepeatedCompositeFieldContainer[Rollback]
    moves: _containers.RepeatedCompositeFieldContainer[Move]
    kept_microbatches: int
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., iterations: _Optional[int] = ..., iterations_completed: _Optional[int] = ..., loss: _Optional[_Iterable[float]] = ..., param_checksum: _Optional[str] = ..., throughput_mb_s: _Optional[float] = ..., dropped_microbatches: _Optional[int] = ..., error: _Optional[str] = ..., microbatches_trained: _Optional[int] = ..., elapsed_s: _Optional[float] = ..., coordinator: _Optional[str] = ..., job_json: _Optional[str] = ..., routes: _Optional[_Iterable[_Union[RouteCount, _Mapping]]] = ..., checksum_mismatches: _Optional[int] = ..., iteration_s: _Optional[_Iterable[float]] = ..., crashes: _Optional[int] = ..., leaves: _Optional[int] = ..., joins: _Optional[int] = ..., rerouted_microbatches: _Optional[int] = ..., replayed_microbatches: _Optional[int] = ..., replayed_s: _Optional[float] = ..., compute_s: _Optional[float] = ..., dropped: _Optional[_Iterable[_Union[IterationMicrobatches, _Mapping]]] = ..., lost_microbatches: _Optional[int] = ..., restarts: _Optional[int] = ..., paused: _Optional[str] = ..., paused_s: _Optional[float] = ..., excluded: _Optional[_Iterable[_Union[Exclusion, _Mapping]]] = ..., resumed_from: _Optional[int] = ..., rollbacks: _Optional[_Iterable[_Union[Rollback, _Mapping]]] = ..., moves: _Optional[_Iterable[_Union[Move, _Mapping]]] = ..., kept_microbatches: _Optional[int] = ...) -> None: ...

class Rollback(_message.Message):
    __slots__ = ("stage", "from_iteration", "to_iteration", "reason")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    FROM_ITERATION_FIELD_NUMBER: _ClassVar[int]
    TO_ITERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    stage: int
    from_iteration: int
    to_iteration: int
    reason: str
    def __init__(self, stage: _Optional[int] = ..., from_iteration: _Optional[int] = ..., to_iteration: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Exclusion(_message.Message):
    __slots__ = ("node", "stage", "iteration", "reason")
    NODE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node: str
    stage: int
    iteration: int
    reason: str
    def __init__(self, node: _Optional[str] = ..., stage: _Optional[int] = ..., iteration: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class IterationMicrobatches(_message.Message):
    __slots__ = ("iteration", "microbatches")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    microbatches: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, iteration: _Optional[int] = ..., microbatches: _Optional[_Iterable[int]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelReply(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: JobState
    def __init__(self, state: _Optional[_Union[JobState, str]] = ...) -> None: ...

class WeightsRequest(_message.Message):
    __slots__ = ("job_id", "stage")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    stage: int
    def __init__(self, job_id: _Optional[str] = ..., stage: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobProgress]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobProgress, _Mapping]]] = ...) -> None: ...

class Participant(_message.Message):
    __slots__ = ("id", "stage")
    ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    stage: int
    def __init__(self, id: _Optional[str] = ..., stage: _Optional[int] = ...) -> None: ...

class PrepareRequest(_message.Message):
    __slots__ = ("sender", "job_json", "resume_iteration")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_JSON_FIELD_NUMBER: _ClassVar[int]
    RESUME_ITERATION_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_json: str
    resume_iteration: int
    def __init__(self, sender: _Optional[str] = ..., job_json: _Optional[str] = ..., resume_iteration: _Optional[int] = ...) -> None: ...

class PrepareReply(_message.Message):
    __slots__ = ("corpus_digest", "flow_units", "flows_settled")
    CORPUS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    FLOW_UNITS_FIELD_NUMBER: _ClassVar[int]
    FLOWS_SETTLED_FIELD_NUMBER: _ClassVar[int]
    corpus_digest: str
    flow_units: int
    flows_settled: bool
    def __init__(self, corpus_digest: _Optional[str] = ..., flow_units: _Optional[int] = ..., flows_settled: _Optional[bool] = ...) -> None: ...

class StartRequest(_message.Message):
    __slots__ = ("sender", "job_id", "coordinator", "participants", "holders", "weights")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    coordinator: str
    participants: _containers.RepeatedCompositeFieldContainer[Participant]
    holders: _containers.RepeatedScalarFieldContainer[str]
    weights: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., coordinator: _Optional[str] = ..., participants: _Optional[_Iterable[_Union[Participant, _Mapping]]] = ..., holders: _Optional[_Iterable[str]] = ..., weights: _Optional[_Iterable[int]] = ...) -> None: ...

class StartReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DoneRequest(_message.Message):
    __slots__ = ("sender", "job_id", "iteration", "microbatches", "flow_units", "flows_settled", "round")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    FLOW_UNITS_FIELD_NUMBER: _ClassVar[int]
    FLOWS_SETTLED_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    iteration: int
    microbatches: _containers.RepeatedScalarFieldContainer[int]
    flow_units: int
    flows_settled: bool
    round: int
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., microbatches: _Optional[_Iterable[int]] = ..., flow_units: _Optional[int] = ..., flows_settled: _Optional[bool] = ..., round: _Optional[int] = ...) -> None: ...

class DoneReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("sender", "job_id", "iteration", "microbatches", "final", "next_holders", "next_weights", "round", "attempt", "members", "excluded", "departed")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    NEXT_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    DEPARTED_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    iteration: int
    microbatches: _containers.RepeatedScalarFieldContainer[int]
    final: bool
    next_holders: _containers.RepeatedScalarFieldContainer[str]
    next_weights: _containers.RepeatedScalarFieldContainer[int]
    round: int
    attempt: int
    members: _containers.RepeatedCompositeFieldContainer[Participant]
    excluded: _containers.RepeatedScalarFieldContainer[str]
    departed: _containers.RepeatedCompositeFieldContainer[_node_pb2.Member]
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., microbatches: _Optional[_Iterable[int]] = ..., final: _Optional[bool] = ..., next_holders: _Optional[_Iterable[str]] = ..., next_weights: _Optional[_Iterable[int]] = ..., round: _Optional[int] = ..., attempt: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Participant, _Mapping]]] = ..., excluded: _Optional[_Iterable[str]] = ..., departed: _Optional[_Iterable[_Union[_node_pb2.Member, _Mapping]]] = ...) -> None: ...

class CommitReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LossEntry(_message.Message):
    __slots__ = ("microbatch", "loss")
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    microbatch: int
    loss: float
    def __init__(self, microbatch: _Optional[int] = ..., loss: _Optional[float] = ...) -> None: ...

class DigestEntry(_message.Message):
    __slots__ = ("name", "digest")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    name: str
    digest: str
    def __init__(self, name: _Optional[str] = ..., digest: _Optional[str] = ...) -> None: ...

class CommittedRequest(_message.Message):
    __slots__ = ("sender", "job_id", "iteration", "stage", "checksum", "digests", "snapshots_landed", "snapshot_lacking")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_LANDED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_LACKING_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    iteration: int
    stage: int
    checksum: str
    digests: _containers.RepeatedCompositeFieldContainer[DigestEntry]
    snapshots_landed: _containers.RepeatedScalarFieldContainer[int]
    snapshot_lacking: int
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., stage: _Optional[int] = ..., checksum: _Optional[str] = ..., digests: _Optional[_Iterable[_Union[DigestEntry, _Mapping]]] = ..., snapshots_landed: _Optional[_Iterable[int]] = ..., snapshot_lacking: _Optional[int] = ...) -> None: ...

class CommittedReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PreparedRequest(_message.Message):
    __slots__ = ("sender", "job_id", "iteration", "round", "attempt", "stage", "contributed", "losses", "routes", "compute_s", "replayed_s", "outliers")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTED_FIELD_NUMBER: _ClassVar[int]
    LOSSES_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_S_FIELD_NUMBER: _ClassVar[int]
    OUTLIERS_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    iteration: int
    round: int
    attempt: int
    stage: int
    contributed: _containers.RepeatedScalarFieldContainer[int]
    losses: _containers.RepeatedCompositeFieldContainer[LossEntry]
    routes: _containers.RepeatedCompositeFieldContainer[RouteCount]
    compute_s: float
    replayed_s: float
    outliers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., round: _Optional[int] = ..., attempt: _Optional[int] = ..., stage: _Optional[int] = ..., contributed: _Optional[_Iterable[int]] = ..., losses: _Optional[_Iterable[_Union[LossEntry, _Mapping]]] = ..., routes: _Optional[_Iterable[_Union[RouteCount, _Mapping]]] = ..., compute_s: _Optional[float] = ..., replayed_s: _Optional[float] = ..., outliers: _Optional[_Iterable[str]] = ...) -> None: ...

class PreparedReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("sender", "job_id", "iteration", "round", "attempt", "final", "next_holders", "participants", "loss", "trained", "next_weights", "dropped", "excluded", "next_round", "move", "periodic", "floor")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    NEXT_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TRAINED_FIELD_NUMBER: _ClassVar[int]
    NEXT_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    NEXT_ROUND_FIELD_NUMBER: _ClassVar[int]
    MOVE_FIELD_NUMBER: _ClassVar[int]
    PERIODIC_FIELD_NUMBER: _ClassVar[int]
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    iteration: int
    round: int
    attempt: int
    final: bool
    next_holders: _containers.RepeatedScalarFieldContainer[str]
    participants: _containers.RepeatedCompositeFieldContainer[Participant]
    loss: float
    trained: int
    next_weights: _containers.RepeatedScalarFieldContainer[int]
    dropped: _containers.RepeatedScalarFieldContainer[int]
    excluded: _containers.RepeatedScalarFieldContainer[str]
    next_round: int
    move: Move
    periodic: bool
    floor: int
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., round: _Optional[int] = ..., attempt: _Optional[int] = ..., final: _Optional[bool] = ..., next_holders: _Optional[_Iterable[str]] = ..., participants: _Optional[_Iterable[_Union[Participant, _Mapping]]] = ..., loss: _Optional[float] = ..., trained: _Optional[int] = ..., next_weights: _Optional[_Iterable[int]] = ..., dropped: _Optional[_Iterable[int]] = ..., excluded: _Optional[_Iterable[str]] = ..., next_round: _Optional[int] = ..., move: _Optional[_Union[Move, _Mapping]] = ..., periodic: _Optional[bool] = ..., floor: _Optional[int] = ...) -> None: ...

class Move(_message.Message):
    __slots__ = ("node", "from_stage", "stage", "iteration", "flow", "gain")
    NODE_FIELD_NUMBER: _ClassVar[int]
    FROM_STAGE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    GAIN_FIELD_NUMBER: _ClassVar[int]
    node: str
    from_stage: int
    stage: int
    iteration: int
    flow: float
    gain: float
    def __init__(self, node: _Optional[str] = ..., from_stage: _Optional[int] = ..., stage: _Optional[int] = ..., iteration: _Optional[int] = ..., flow: _Optional[float] = ..., gain: _Optional[float] = ...) -> None: ...

class StepReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("sender", "job_id", "iteration", "round", "dead")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    iteration: int
    round: int
    dead: str
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., round: _Optional[int] = ..., dead: _Optional[str] = ...) -> None: ...

class EvidenceEntry(_message.Message):
    __slots__ = ("microbatch", "evidence")
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    microbatch: int
    evidence: int
    def __init__(self, microbatch: _Optional[int] = ..., evidence: _Optional[int] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ("node", "stage", "evidence", "kept")
    NODE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    node: str
    stage: int
    evidence: _containers.RepeatedCompositeFieldContainer[EvidenceEntry]
    kept: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node: _Optional[str] = ..., stage: _Optional[int] = ..., evidence: _Optional[_Iterable[_Union[EvidenceEntry, _Mapping]]] = ..., kept: _Optional[_Iterable[int]] = ...) -> None: ...

class RecoverRequest(_message.Message):
    __slots__ = ("sender", "job_id", "iteration", "round", "microbatch", "stage", "rule", "dead", "gradient_from")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FROM_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    iteration: int
    round: int
    microbatch: int
    stage: int
    rule: int
    dead: str
    gradient_from: str
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., round: _Optional[int] = ..., microbatch: _Optional[int] = ..., stage: _Optional[int] = ..., rule: _Optional[int] = ..., dead: _Optional[str] = ..., gradient_from: _Optional[str] = ...) -> None: ...

class RecoverReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KeptHop(_message.Message):
    __slots__ = ("microbatch", "upstream", "downstream", "loss", "path")
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    DOWNSTREAM_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    microbatch: int
    upstream: str
    downstream: str
    loss: float
    path: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, microbatch: _Optional[int] = ..., upstream: _Optional[str] = ..., downstream: _Optional[str] = ..., loss: _Optional[float] = ..., path: _Optional[_Iterable[str]] = ...) -> None: ...

class KeepRequest(_message.Message):
    __slots__ = ("sender", "job_id", "iteration", "round", "dead", "stage", "keeper", "hops")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    KEEPER_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    iteration: int
    round: int
    dead: str
    stage: int
    keeper: str
    hops: _containers.RepeatedCompositeFieldContainer[KeptHop]
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., round: _Optional[int] = ..., dead: _Optional[str] = ..., stage: _Optional[int] = ..., keeper: _Optional[str] = ..., hops: _Optional[_Iterable[_Union[KeptHop, _Mapping]]] = ...) -> None: ...

class KeepReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RedirectRequest(_message.Message):
    __slots__ = ("sender", "job_id", "iteration", "round", "microbatch", "stage", "mode")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    iteration: int
    round: int
    microbatch: int
    stage: int
    mode: int
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., round: _Optional[int] = ..., microbatch: _Optional[int] = ..., stage: _Optional[int] = ..., mode: _Optional[int] = ...) -> None: ...

class RedirectReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplayedRequest(_message.Message):
    __slots__ = ("sender", "job_id", "iteration", "round", "microbatch", "stage")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    iteration: int
    round: int
    microbatch: int
    stage: int
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., round: _Optional[int] = ..., microbatch: _Optional[int] = ..., stage: _Optional[int] = ...) -> None: ...

class ReplayedReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RestartRequest(_message.Message):
    __slots__ = ("sender", "job_id", "iteration", "round", "holders", "participants", "reason", "weights", "rollback")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    iteration: int
    round: int
    holders: _containers.RepeatedScalarFieldContainer[str]
    participants: _containers.RepeatedCompositeFieldContainer[Participant]
    reason: str
    weights: _containers.RepeatedScalarFieldContainer[int]
    rollback: bool
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., round: _Optional[int] = ..., holders: _Optional[_Iterable[str]] = ..., participants: _Optional[_Iterable[_Union[Participant, _Mapping]]] = ..., reason: _Optional[str] = ..., weights: _Optional[_Iterable[int]] = ..., rollback: _Optional[bool] = ...) -> None: ...

class RestartReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SyncRequest(_message.Message):
    __slots__ = ("sender", "job_id")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class SyncReply(_message.Message):
    __slots__ = ("iteration", "round", "prepared", "attempt", "stepped", "stepped_iteration", "stepped_loss", "stepped_trained", "stepped_dropped", "coordinator", "declared", "floor", "stepped_periodic")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PREPARED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STEPPED_FIELD_NUMBER: _ClassVar[int]
    STEPPED_ITERATION_FIELD_NUMBER: _ClassVar[int]
    STEPPED_LOSS_FIELD_NUMBER: _ClassVar[int]
    STEPPED_TRAINED_FIELD_NUMBER: _ClassVar[int]
    STEPPED_DROPPED_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    DECLARED_FIELD_NUMBER: _ClassVar[int]
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    STEPPED_PERIODIC_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    round: int
    prepared: bool
    attempt: int
    stepped: bool
    stepped_iteration: int
    stepped_loss: float
    stepped_trained: int
    stepped_dropped: _containers.RepeatedCompositeFieldContainer[IterationMicrobatches]
    coordinator: str
    declared: _containers.RepeatedScalarFieldContainer[int]
    floor: int
    stepped_periodic: bool
    def __init__(self, iteration: _Optional[int] = ..., round: _Optional[int] = ..., prepared: _Optional[bool] = ..., attempt: _Optional[int] = ..., stepped: _Optional[bool] = ..., stepped_iteration: _Optional[int] = ..., stepped_loss: _Optional[float] = ..., stepped_trained: _Optional[int] = ..., stepped_dropped: _Optional[_Iterable[_Union[IterationMicrobatches, _Mapping]]] = ..., coordinator: _Optional[str] = ..., declared: _Optional[_Iterable[int]] = ..., floor: _Optional[int] = ..., stepped_periodic: _Optional[bool] = ...) -> None: ...

class EnterRequest(_message.Message):
    __slots__ = ("sender", "job_id", "stage", "has_state", "state_iteration")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    HAS_STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_ITERATION_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    stage: int
    has_state: bool
    state_iteration: int
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., stage: _Optional[int] = ..., has_state: _Optional[bool] = ..., state_iteration: _Optional[int] = ...) -> None: ...

class EnterReply(_message.Message):
    __slots__ = ("admitted", "iteration", "round", "donors", "participants", "holders", "coordinator", "rollback", "snapshot_iteration", "declared", "floor")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DONORS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ITERATION_FIELD_NUMBER: _ClassVar[int]
    DECLARED_FIELD_NUMBER: _ClassVar[int]
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    admitted: bool
    iteration: int
    round: int
    donors: _containers.RepeatedScalarFieldContainer[str]
    participants: _containers.RepeatedCompositeFieldContainer[Participant]
    holders: _containers.RepeatedScalarFieldContainer[str]
    coordinator: str
    rollback: bool
    snapshot_iteration: int
    declared: _containers.RepeatedScalarFieldContainer[int]
    floor: int
    def __init__(self, admitted: _Optional[bool] = ..., iteration: _Optional[int] = ..., round: _Optional[int] = ..., donors: _Optional[_Iterable[str]] = ..., participants: _Optional[_Iterable[_Union[Participant, _Mapping]]] = ..., holders: _Optional[_Iterable[str]] = ..., coordinator: _Optional[str] = ..., rollback: _Optional[bool] = ..., snapshot_iteration: _Optional[int] = ..., declared: _Optional[_Iterable[int]] = ..., floor: _Optional[int] = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("sender", "job_id", "participants")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    participants: _containers.RepeatedCompositeFieldContainer[Participant]
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., participants: _Optional[_Iterable[_Union[Participant, _Mapping]]] = ...) -> None: ...

class AdmitReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StateRequest(_message.Message):
    __slots__ = ("sender", "job_id", "stage", "exact", "iteration")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    stage: int
    exact: bool
    iteration: int
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., stage: _Optional[int] = ..., exact: _Optional[bool] = ..., iteration: _Optional[int] = ...) -> None: ...

class StateChunk(_message.Message):
    __slots__ = ("seq", "stage", "iteration", "total_bytes", "payload", "job_id", "sender", "periodic")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    PERIODIC_FIELD_NUMBER: _ClassVar[int]
    seq: int
    stage: int
    iteration: int
    total_bytes: int
    payload: bytes
    job_id: str
    sender: str
    periodic: bool
    def __init__(self, seq: _Optional[int] = ..., stage: _Optional[int] = ..., iteration: _Optional[int] = ..., total_bytes: _Optional[int] = ..., payload: _Optional[bytes] = ..., job_id: _Optional[str] = ..., sender: _Optional[str] = ..., periodic: _Optional[bool] = ...) -> None: ...

class BackupAck(_message.Message):
    __slots__ = ("received_bytes",)
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    received_bytes: int
    def __init__(self, received_bytes: _Optional[int] = ...) -> None: ...

class ProgressRequest(_message.Message):
    __slots__ = ("sender", "progress")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    sender: str
    progress: JobProgress
    def __init__(self, sender: _Optional[str] = ..., progress: _Optional[_Union[JobProgress, _Mapping]] = ...) -> None: ...

class ProgressReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FailRequest(_message.Message):
    __slots__ = ("sender", "job_id", "reason")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    reason: str
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class FailReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ContributionHeader(_message.Message):
    __slots__ = ("sender", "job_id", "iteration", "stage", "microbatches", "dtype", "numel", "round", "attempt", "kind", "offset", "slice_lo", "slice_hi", "basis", "hops")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        WHOLE: _ClassVar[ContributionHeader.Kind]
        PARTIAL: _ClassVar[ContributionHeader.Kind]
        REDUCED: _ClassVar[ContributionHeader.Kind]
        KEPT: _ClassVar[ContributionHeader.Kind]
    WHOLE: ContributionHeader.Kind
    PARTIAL: ContributionHeader.Kind
    REDUCED: ContributionHeader.Kind
    KEPT: ContributionHeader.Kind
    SENDER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUMEL_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SLICE_LO_FIELD_NUMBER: _ClassVar[int]
    SLICE_HI_FIELD_NUMBER: _ClassVar[int]
    BASIS_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    sender: str
    job_id: str
    iteration: int
    stage: int
    microbatches: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    numel: int
    round: int
    attempt: int
    kind: ContributionHeader.Kind
    offset: int
    slice_lo: int
    slice_hi: int
    basis: str
    hops: _containers.RepeatedCompositeFieldContainer[KeptHop]
    def __init__(self, sender: _Optional[str] = ..., job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., stage: _Optional[int] = ..., microbatches: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., numel: _Optional[int] = ..., round: _Optional[int] = ..., attempt: _Optional[int] = ..., kind: _Optional[_Union[ContributionHeader.Kind, str]] = ..., offset: _Optional[int] = ..., slice_lo: _Optional[int] = ..., slice_hi: _Optional[int] = ..., basis: _Optional[str] = ..., hops: _Optional[_Iterable[_Union[KeptHop, _Mapping]]] = ...) -> None: ...

class ContributionChunk(_message.Message):
    __slots__ = ("seq", "header", "payload")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    seq: int
    header: ContributionHeader
    payload: bytes
    def __init__(self, seq: _Optional[int] = ..., header: _Optional[_Union[ContributionHeader, _Mapping]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class ContributionAck(_message.Message):
    __slots__ = ("received_bytes", "complete")
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    received_bytes: int
    complete: bool
    def __init__(self, received_bytes: _Optional[int] = ..., complete: _Optional[bool] = ...) -> None: ...
