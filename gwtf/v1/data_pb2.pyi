from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Direction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIRECTION_UNSPECIFIED: _ClassVar[Direction]
    DIRECTION_FORWARD: _ClassVar[Direction]
    DIRECTION_BACKWARD: _ClassVar[Direction]
DIRECTION_UNSPECIFIED: Direction
DIRECTION_FORWARD: Direction
DIRECTION_BACKWARD: Direction

class MicrobatchTag(_message.Message):
    __slots__ = ("job_id", "iteration", "microbatch", "direction", "sender", "path", "attempt", "mode", "round", "downstream", "recovered_from")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DOWNSTREAM_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_FROM_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    iteration: int
    microbatch: int
    direction: Direction
    sender: str
    path: _containers.RepeatedScalarFieldContainer[str]
    attempt: int
    mode: int
    round: int
    downstream: str
    recovered_from: str
    def __init__(self, job_id: _Optional[str] = ..., iteration: _Optional[int] = ..., microbatch: _Optional[int] = ..., direction: _Optional[_Union[Direction, str]] = ..., sender: _Optional[str] = ..., path: _Optional[_Iterable[str]] = ..., attempt: _Optional[int] = ..., mode: _Optional[int] = ..., round: _Optional[int] = ..., downstream: _Optional[str] = ..., recovered_from: _Optional[str] = ...) -> None: ...

class TensorHeader(_message.Message):
    __slots__ = ("name", "dtype", "shape", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ...) -> None: ...

class StreamHeader(_message.Message):
    __slots__ = ("tag", "tensors")
    TAG_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    tag: MicrobatchTag
    tensors: _containers.RepeatedCompositeFieldContainer[TensorHeader]
    def __init__(self, tag: _Optional[_Union[MicrobatchTag, _Mapping]] = ..., tensors: _Optional[_Iterable[_Union[TensorHeader, _Mapping]]] = ...) -> None: ...

class DataChunk(_message.Message):
    __slots__ = ("seq", "header", "payload")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    seq: int
    header: StreamHeader
    payload: bytes
    def __init__(self, seq: _Optional[int] = ..., header: _Optional[_Union[StreamHeader, _Mapping]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class DataAck(_message.Message):
    __slots__ = ("received_bytes", "pace_s")
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PACE_S_FIELD_NUMBER: _ClassVar[int]
    received_bytes: int
    pace_s: float
    def __init__(self, received_bytes: _Optional[int] = ..., pace_s: _Optional[float] = ...) -> None: ...
