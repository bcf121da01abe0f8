from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers

DESCRIPTOR: _descriptor.FileDescriptor

class JoinRequest(_message.Message):
    __slots__ = ("config_hash", "config_view_json", "participant_id", "software_version")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    CONFIG_VIEW_JSON_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    config_hash: str
    config_view_json: str
    software_version: str
    def __init__(
        self,
        participant_id: str | None = ...,
        config_hash: str | None = ...,
        config_view_json: str | None = ...,
        software_version: str | None = ...,
    ) -> None: ...

class JoinReply(_message.Message):
    __slots__ = (
        "accepted",
        "already_submitted",
        "collecting_attempt",
        "collecting_round",
        "config_hash",
        "differing_fields",
        "message",
        "round_open",
        "run_over",
        "session",
        "software_version",
    )
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DIFFERING_FIELDS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    COLLECTING_ROUND_FIELD_NUMBER: _ClassVar[int]
    ROUND_OPEN_FIELD_NUMBER: _ClassVar[int]
    COLLECTING_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ALREADY_SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    RUN_OVER_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    message: str
    differing_fields: _containers.RepeatedScalarFieldContainer[str]
    config_hash: str
    software_version: str
    session: str
    collecting_round: int
    round_open: bool
    collecting_attempt: int
    already_submitted: bool
    run_over: bool
    def __init__(
        self,
        accepted: bool | None = ...,
        message: str | None = ...,
        differing_fields: _Iterable[str] | None = ...,
        config_hash: str | None = ...,
        software_version: str | None = ...,
        session: str | None = ...,
        collecting_round: int | None = ...,
        round_open: bool | None = ...,
        collecting_attempt: int | None = ...,
        already_submitted: bool | None = ...,
        run_over: bool | None = ...,
    ) -> None: ...

class WatchRoundsRequest(_message.Message):
    __slots__ = ("after_attempt", "after_round", "participant_id", "session")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    AFTER_ROUND_FIELD_NUMBER: _ClassVar[int]
    AFTER_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session: str
    after_round: int
    after_attempt: int
    def __init__(
        self,
        participant_id: str | None = ...,
        session: str | None = ...,
        after_round: int | None = ...,
        after_attempt: int | None = ...,
    ) -> None: ...

class RoundAnnouncement(_message.Message):
    __slots__ = (
        "attempt",
        "deadline_in_s",
        "final",
        "model_bytes",
        "model_hash",
        "model_version",
        "round_index",
    )
    ROUND_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_IN_S_FIELD_NUMBER: _ClassVar[int]
    MODEL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    round_index: int
    attempt: int
    model_version: int
    model_hash: str
    deadline_in_s: float
    model_bytes: int
    final: bool
    def __init__(
        self,
        round_index: int | None = ...,
        attempt: int | None = ...,
        model_version: int | None = ...,
        model_hash: str | None = ...,
        deadline_in_s: float | None = ...,
        model_bytes: int | None = ...,
        final: bool | None = ...,
    ) -> None: ...

class FetchModelRequest(_message.Message):
    __slots__ = ("model_hash", "participant_id", "session")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session: str
    model_hash: str
    def __init__(
        self,
        participant_id: str | None = ...,
        session: str | None = ...,
        model_hash: str | None = ...,
    ) -> None: ...

class ModelChunk(_message.Message):
    __slots__ = ("data", "model_hash", "total_bytes")
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    model_hash: str
    total_bytes: int
    data: bytes
    def __init__(
        self,
        model_hash: str | None = ...,
        total_bytes: int | None = ...,
        data: bytes | None = ...,
    ) -> None: ...

class UpdateHeader(_message.Message):
    __slots__ = (
        "attempt",
        "compute_s",
        "participant_id",
        "payload_hash",
        "quantization",
        "round_index",
        "session",
        "total_bytes",
    )
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_HASH_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session: str
    round_index: int
    attempt: int
    payload_hash: str
    quantization: str
    total_bytes: int
    compute_s: float
    def __init__(
        self,
        participant_id: str | None = ...,
        session: str | None = ...,
        round_index: int | None = ...,
        attempt: int | None = ...,
        payload_hash: str | None = ...,
        quantization: str | None = ...,
        total_bytes: int | None = ...,
        compute_s: float | None = ...,
    ) -> None: ...

class UpdateChunk(_message.Message):
    __slots__ = ("data", "header")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: UpdateHeader
    data: bytes
    def __init__(
        self, header: UpdateHeader | _Mapping | None = ..., data: bytes | None = ...
    ) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("accepted", "current_round", "message", "reason")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    message: str
    current_round: int
    def __init__(
        self,
        accepted: bool | None = ...,
        reason: str | None = ...,
        message: str | None = ...,
        current_round: int | None = ...,
    ) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("participant_id", "reason", "session")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session: str
    reason: str
    def __init__(
        self,
        participant_id: str | None = ...,
        session: str | None = ...,
        reason: str | None = ...,
    ) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
