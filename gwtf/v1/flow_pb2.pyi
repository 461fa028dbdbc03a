from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FlowMessage(_message.Message):
    __slots__ = ("sender", "receiver", "sender_epoch", "receiver_epoch", "gen", "from_tail", "price", "flow", "echo", "eps")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    SENDER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GEN_FIELD_NUMBER: _ClassVar[int]
    FROM_TAIL_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    ECHO_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    sender: str
    receiver: str
    sender_epoch: int
    receiver_epoch: int
    gen: int
    from_tail: bool
    price: int
    flow: int
    echo: int
    eps: int
    def __init__(self, sender: _Optional[str] = ..., receiver: _Optional[str] = ..., sender_epoch: _Optional[int] = ..., receiver_epoch: _Optional[int] = ..., gen: _Optional[int] = ..., from_tail: _Optional[bool] = ..., price: _Optional[int] = ..., flow: _Optional[int] = ..., echo: _Optional[int] = ..., eps: _Optional[int] = ...) -> None: ...

class ArcParams(_message.Message):
    __slots__ = ("tail", "head", "tail_epoch", "head_epoch", "gen", "cap", "cost")
    TAIL_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    TAIL_EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEAD_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GEN_FIELD_NUMBER: _ClassVar[int]
    CAP_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    tail: str
    head: str
    tail_epoch: int
    head_epoch: int
    gen: int
    cap: int
    cost: int
    def __init__(self, tail: _Optional[str] = ..., head: _Optional[str] = ..., tail_epoch: _Optional[int] = ..., head_epoch: _Optional[int] = ..., gen: _Optional[int] = ..., cap: _Optional[int] = ..., cost: _Optional[int] = ...) -> None: ...

class FlowBatch(_message.Message):
    __slots__ = ("messages", "arcs", "sender", "sender_epoch")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ARCS_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    SENDER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[FlowMessage]
    arcs: _containers.RepeatedCompositeFieldContainer[ArcParams]
    sender: str
    sender_epoch: int
    def __init__(self, messages: _Optional[_Iterable[_Union[FlowMessage, _Mapping]]] = ..., arcs: _Optional[_Iterable[_Union[ArcParams, _Mapping]]] = ..., sender: _Optional[str] = ..., sender_epoch: _Optional[int] = ...) -> None: ...

class FlowAck(_message.Message):
    __slots__ = ("ok", "error")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: str
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class PhaseCommand(_message.Message):
    __slots__ = ("coordinator", "round", "tightens", "scaling")
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TIGHTENS_FIELD_NUMBER: _ClassVar[int]
    SCALING_FIELD_NUMBER: _ClassVar[int]
    coordinator: str
    round: int
    tightens: int
    scaling: bool
    def __init__(self, coordinator: _Optional[str] = ..., round: _Optional[int] = ..., tightens: _Optional[int] = ..., scaling: _Optional[bool] = ...) -> None: ...

class PhaseReport(_message.Message):
    __slots__ = ("id", "epoch", "round", "tightens", "final", "quiet", "activity", "wants_rescale", "view", "edits")
    ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TIGHTENS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    QUIET_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    WANTS_RESCALE_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    EDITS_FIELD_NUMBER: _ClassVar[int]
    id: str
    epoch: int
    round: int
    tightens: int
    final: bool
    quiet: bool
    activity: int
    wants_rescale: bool
    view: int
    edits: int
    def __init__(self, id: _Optional[str] = ..., epoch: _Optional[int] = ..., round: _Optional[int] = ..., tightens: _Optional[int] = ..., final: _Optional[bool] = ..., quiet: _Optional[bool] = ..., activity: _Optional[int] = ..., wants_rescale: _Optional[bool] = ..., view: _Optional[int] = ..., edits: _Optional[int] = ...) -> None: ...

class NudgeRequest(_message.Message):
    __slots__ = ("sender", "wants_rescale")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    WANTS_RESCALE_FIELD_NUMBER: _ClassVar[int]
    sender: str
    wants_rescale: bool
    def __init__(self, sender: _Optional[str] = ..., wants_rescale: _Optional[bool] = ...) -> None: ...

class NudgeReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
