from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemberState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBER_STATE_UNSPECIFIED: _ClassVar[MemberState]
    MEMBER_STATE_ALIVE: _ClassVar[MemberState]
    MEMBER_STATE_DEAD: _ClassVar[MemberState]
    MEMBER_STATE_LEFT: _ClassVar[MemberState]
MEMBER_STATE_UNSPECIFIED: MemberState
MEMBER_STATE_ALIVE: MemberState
MEMBER_STATE_DEAD: MemberState
MEMBER_STATE_LEFT: MemberState

class Member(_message.Message):
    __slots__ = ("id", "address", "stage", "location", "compute_s", "capacity", "epoch", "heartbeat", "state", "links", "blocked", "revision", "movable", "uplink_gbps", "relay")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    MOVABLE_FIELD_NUMBER: _ClassVar[int]
    UPLINK_GBPS_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    stage: int
    location: str
    compute_s: float
    capacity: float
    epoch: int
    heartbeat: int
    state: MemberState
    links: _containers.RepeatedCompositeFieldContainer[LinkReport]
    blocked: _containers.RepeatedScalarFieldContainer[str]
    revision: int
    movable: bool
    uplink_gbps: float
    relay: str
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., stage: _Optional[int] = ..., location: _Optional[str] = ..., compute_s: _Optional[float] = ..., capacity: _Optional[float] = ..., epoch: _Optional[int] = ..., heartbeat: _Optional[int] = ..., state: _Optional[_Union[MemberState, str]] = ..., links: _Optional[_Iterable[_Union[LinkReport, _Mapping]]] = ..., blocked: _Optional[_Iterable[str]] = ..., revision: _Optional[int] = ..., movable: _Optional[bool] = ..., uplink_gbps: _Optional[float] = ..., relay: _Optional[str] = ...) -> None: ...

class LinkReport(_message.Message):
    __slots__ = ("site", "rtt_level", "bandwidth_level")
    SITE_FIELD_NUMBER: _ClassVar[int]
    RTT_LEVEL_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_LEVEL_FIELD_NUMBER: _ClassVar[int]
    site: str
    rtt_level: int
    bandwidth_level: int
    def __init__(self, site: _Optional[str] = ..., rtt_level: _Optional[int] = ..., bandwidth_level: _Optional[int] = ...) -> None: ...

class SwarmConfig(_message.Message):
    __slots__ = ("swarm_id", "num_stages", "activation_bytes", "big_m", "max_cost", "eps_final", "eps_start", "eps_factor", "rescale_after", "quiet_s", "routing")
    SWARM_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_STAGES_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_BYTES_FIELD_NUMBER: _ClassVar[int]
    BIG_M_FIELD_NUMBER: _ClassVar[int]
    MAX_COST_FIELD_NUMBER: _ClassVar[int]
    EPS_FINAL_FIELD_NUMBER: _ClassVar[int]
    EPS_START_FIELD_NUMBER: _ClassVar[int]
    EPS_FACTOR_FIELD_NUMBER: _ClassVar[int]
    RESCALE_AFTER_FIELD_NUMBER: _ClassVar[int]
    QUIET_S_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    swarm_id: str
    num_stages: int
    activation_bytes: int
    big_m: int
    max_cost: int
    eps_final: int
    eps_start: int
    eps_factor: int
    rescale_after: int
    quiet_s: float
    routing: str
    def __init__(self, swarm_id: _Optional[str] = ..., num_stages: _Optional[int] = ..., activation_bytes: _Optional[int] = ..., big_m: _Optional[int] = ..., max_cost: _Optional[int] = ..., eps_final: _Optional[int] = ..., eps_start: _Optional[int] = ..., eps_factor: _Optional[int] = ..., rescale_after: _Optional[int] = ..., quiet_s: _Optional[float] = ..., routing: _Optional[str] = ...) -> None: ...

class ConfigRequest(_message.Message):
    __slots__ = ("stage",)
    STAGE_FIELD_NUMBER: _ClassVar[int]
    stage: int
    def __init__(self, stage: _Optional[int] = ...) -> None: ...

class ConfigReply(_message.Message):
    __slots__ = ("swarm",)
    SWARM_FIELD_NUMBER: _ClassVar[int]
    swarm: SwarmConfig
    def __init__(self, swarm: _Optional[_Union[SwarmConfig, _Mapping]] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("member",)
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    member: Member
    def __init__(self, member: _Optional[_Union[Member, _Mapping]] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("swarm", "members", "round", "tightens", "final")
    SWARM_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TIGHTENS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    swarm: SwarmConfig
    members: _containers.RepeatedCompositeFieldContainer[Member]
    round: int
    tightens: int
    final: bool
    def __init__(self, swarm: _Optional[_Union[SwarmConfig, _Mapping]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., round: _Optional[int] = ..., tightens: _Optional[int] = ..., final: _Optional[bool] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("id", "epoch")
    ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    id: str
    epoch: int
    def __init__(self, id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GossipRequest(_message.Message):
    __slots__ = ("swarm_id", "sender", "members", "view", "spreading")
    SWARM_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    SPREADING_FIELD_NUMBER: _ClassVar[int]
    swarm_id: str
    sender: str
    members: _containers.RepeatedCompositeFieldContainer[Member]
    view: int
    spreading: bool
    def __init__(self, swarm_id: _Optional[str] = ..., sender: _Optional[str] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., view: _Optional[int] = ..., spreading: _Optional[bool] = ...) -> None: ...

class GossipReply(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class EchoRequest(_message.Message):
    __slots__ = ("sender", "nonce", "payload")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    sender: str
    nonce: int
    payload: bytes
    def __init__(self, sender: _Optional[str] = ..., nonce: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class EchoReply(_message.Message):
    __slots__ = ("nonce", "received_bytes")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    received_bytes: int
    def __init__(self, nonce: _Optional[int] = ..., received_bytes: _Optional[int] = ...) -> None: ...

class DialBackRequest(_message.Message):
    __slots__ = ("address",)
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    def __init__(self, address: _Optional[str] = ...) -> None: ...

class DialBackReply(_message.Message):
    __slots__ = ("reachable", "detail")
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    reachable: bool
    detail: str
    def __init__(self, reachable: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("node_id", "epoch")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class RelayEvent(_message.Message):
    __slots__ = ("address", "relay", "connection")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    address: str
    relay: str
    connection: int
    def __init__(self, address: _Optional[str] = ..., relay: _Optional[str] = ..., connection: _Optional[int] = ...) -> None: ...

class PipeChunk(_message.Message):
    __slots__ = ("connection", "data")
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    connection: int
    data: bytes
    def __init__(self, connection: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("swarm",)
    SWARM_FIELD_NUMBER: _ClassVar[int]
    swarm: bool
    def __init__(self, swarm: _Optional[bool] = ...) -> None: ...

class ArcStatus(_message.Message):
    __slots__ = ("src", "dst", "flow", "cap", "cost", "gen", "rtt_ms", "bandwidth_gbps", "ring", "measured_rtt_ms", "measured_bandwidth_gbps", "rtt_probes")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    CAP_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    GEN_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_GBPS_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    MEASURED_RTT_MS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_BANDWIDTH_GBPS_FIELD_NUMBER: _ClassVar[int]
    RTT_PROBES_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    flow: int
    cap: int
    cost: int
    gen: int
    rtt_ms: float
    bandwidth_gbps: float
    ring: bool
    measured_rtt_ms: float
    measured_bandwidth_gbps: float
    rtt_probes: int
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., flow: _Optional[int] = ..., cap: _Optional[int] = ..., cost: _Optional[int] = ..., gen: _Optional[int] = ..., rtt_ms: _Optional[float] = ..., bandwidth_gbps: _Optional[float] = ..., ring: _Optional[bool] = ..., measured_rtt_ms: _Optional[float] = ..., measured_bandwidth_gbps: _Optional[float] = ..., rtt_probes: _Optional[int] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("member", "round", "tightens", "final", "quiet", "eps", "arcs", "throughput", "flow_messages_sent", "flow_batches_sent", "gossip_bytes_sent", "gossip_calls_sent", "uptime_s", "departed", "wan_stack_rtt_ms", "busy", "flow_messages_received", "flow_messages_emitted", "routing", "solves", "view_changes", "repairs", "last_solve_s", "solve_waited_s", "message_delay_s", "relayed_bytes")
    class RelayedBytesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TIGHTENS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    QUIET_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    ARCS_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    FLOW_MESSAGES_SENT_FIELD_NUMBER: _ClassVar[int]
    FLOW_BATCHES_SENT_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_CALLS_SENT_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    DEPARTED_FIELD_NUMBER: _ClassVar[int]
    WAN_STACK_RTT_MS_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    FLOW_MESSAGES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    FLOW_MESSAGES_EMITTED_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    SOLVES_FIELD_NUMBER: _ClassVar[int]
    VIEW_CHANGES_FIELD_NUMBER: _ClassVar[int]
    REPAIRS_FIELD_NUMBER: _ClassVar[int]
    LAST_SOLVE_S_FIELD_NUMBER: _ClassVar[int]
    SOLVE_WAITED_S_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    RELAYED_BYTES_FIELD_NUMBER: _ClassVar[int]
    member: Member
    round: int
    tightens: int
    final: bool
    quiet: bool
    eps: int
    arcs: _containers.RepeatedCompositeFieldContainer[ArcStatus]
    throughput: int
    flow_messages_sent: int
    flow_batches_sent: int
    gossip_bytes_sent: int
    gossip_calls_sent: int
    uptime_s: float
    departed: _containers.RepeatedScalarFieldContainer[str]
    wan_stack_rtt_ms: float
    busy: _containers.RepeatedScalarFieldContainer[str]
    flow_messages_received: int
    flow_messages_emitted: int
    routing: str
    solves: int
    view_changes: int
    repairs: int
    last_solve_s: float
    solve_waited_s: float
    message_delay_s: float
    relayed_bytes: _containers.ScalarMap[str, int]
    def __init__(self, member: _Optional[_Union[Member, _Mapping]] = ..., round: _Optional[int] = ..., tightens: _Optional[int] = ..., final: _Optional[bool] = ..., quiet: _Optional[bool] = ..., eps: _Optional[int] = ..., arcs: _Optional[_Iterable[_Union[ArcStatus, _Mapping]]] = ..., throughput: _Optional[int] = ..., flow_messages_sent: _Optional[int] = ..., flow_batches_sent: _Optional[int] = ..., gossip_bytes_sent: _Optional[int] = ..., gossip_calls_sent: _Optional[int] = ..., uptime_s: _Optional[float] = ..., departed: _Optional[_Iterable[str]] = ..., wan_stack_rtt_ms: _Optional[float] = ..., busy: _Optional[_Iterable[str]] = ..., flow_messages_received: _Optional[int] = ..., flow_messages_emitted: _Optional[int] = ..., routing: _Optional[str] = ..., solves: _Optional[int] = ..., view_changes: _Optional[int] = ..., repairs: _Optional[int] = ..., last_solve_s: _Optional[float] = ..., solve_waited_s: _Optional[float] = ..., message_delay_s: _Optional[float] = ..., relayed_bytes: _Optional[_Mapping[str, int]] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("node", "swarm", "members", "nodes", "unreachable")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SWARM_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    node: str
    swarm: SwarmConfig
    members: _containers.RepeatedCompositeFieldContainer[Member]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    unreachable: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node: _Optional[str] = ..., swarm: _Optional[_Union[SwarmConfig, _Mapping]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., unreachable: _Optional[_Iterable[str]] = ...) -> None: ...
