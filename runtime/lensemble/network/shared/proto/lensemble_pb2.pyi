from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JoinRequest(_message.Message):
    __slots__ = ("participant_id", "config_hash", "config_view_json", "software_version")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    CONFIG_VIEW_JSON_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    config_hash: str
    config_view_json: str
    software_version: str
    def __init__(self, participant_id: _Optional[str] = ..., config_hash: _Optional[str] = ..., config_view_json: _Optional[str] = ..., software_version: _Optional[str] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("accepted", "message", "differing_fields", "config_hash", "software_version", "session", "collecting_round", "round_open", "collecting_attempt", "already_submitted", "run_over")
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
    def __init__(self, accepted: _Optional[bool] = ..., message: _Optional[str] = ..., differing_fields: _Optional[_Iterable[str]] = ..., config_hash: _Optional[str] = ..., software_version: _Optional[str] = ..., session: _Optional[str] = ..., collecting_round: _Optional[int] = ..., round_open: _Optional[bool] = ..., collecting_attempt: _Optional[int] = ..., already_submitted: _Optional[bool] = ..., run_over: _Optional[bool] = ...) -> None: ...

class WatchRoundsRequest(_message.Message):
    __slots__ = ("participant_id", "session", "after_round", "after_attempt")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    AFTER_ROUND_FIELD_NUMBER: _ClassVar[int]
    AFTER_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session: str
    after_round: int
    after_attempt: int
    def __init__(self, participant_id: _Optional[str] = ..., session: _Optional[str] = ..., after_round: _Optional[int] = ..., after_attempt: _Optional[int] = ...) -> None: ...

class RoundAnnouncement(_message.Message):
    __slots__ = ("round_index", "attempt", "model_version", "model_hash", "deadline_in_s", "model_bytes", "final", "base_hash")
    ROUND_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_IN_S_FIELD_NUMBER: _ClassVar[int]
    MODEL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    BASE_HASH_FIELD_NUMBER: _ClassVar[int]
    round_index: int
    attempt: int
    model_version: int
    model_hash: str
    deadline_in_s: float
    model_bytes: int
    final: bool
    base_hash: str
    def __init__(self, round_index: _Optional[int] = ..., attempt: _Optional[int] = ..., model_version: _Optional[int] = ..., model_hash: _Optional[str] = ..., deadline_in_s: _Optional[float] = ..., model_bytes: _Optional[int] = ..., final: _Optional[bool] = ..., base_hash: _Optional[str] = ...) -> None: ...

class FetchModelRequest(_message.Message):
    __slots__ = ("participant_id", "session", "model_hash")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session: str
    model_hash: str
    def __init__(self, participant_id: _Optional[str] = ..., session: _Optional[str] = ..., model_hash: _Optional[str] = ...) -> None: ...

class ModelChunk(_message.Message):
    __slots__ = ("model_hash", "total_bytes", "data")
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    model_hash: str
    total_bytes: int
    data: bytes
    def __init__(self, model_hash: _Optional[str] = ..., total_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UpdateHeader(_message.Message):
    __slots__ = ("participant_id", "session", "round_index", "attempt", "payload_hash", "quantization", "total_bytes", "compute_s")
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
    def __init__(self, participant_id: _Optional[str] = ..., session: _Optional[str] = ..., round_index: _Optional[int] = ..., attempt: _Optional[int] = ..., payload_hash: _Optional[str] = ..., quantization: _Optional[str] = ..., total_bytes: _Optional[int] = ..., compute_s: _Optional[float] = ...) -> None: ...

class UpdateChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: UpdateHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[UpdateHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("accepted", "reason", "message", "current_round")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    message: str
    current_round: int
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., current_round: _Optional[int] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("participant_id", "session", "reason")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session: str
    reason: str
    def __init__(self, participant_id: _Optional[str] = ..., session: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PresenceRequest(_message.Message):
    __slots__ = ("participant_id", "session")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session: str
    def __init__(self, participant_id: _Optional[str] = ..., session: _Optional[str] = ...) -> None: ...

class PresenceBeat(_message.Message):
    __slots__ = ("collecting_round",)
    COLLECTING_ROUND_FIELD_NUMBER: _ClassVar[int]
    collecting_round: int
    def __init__(self, collecting_round: _Optional[int] = ...) -> None: ...

class AbstainRequest(_message.Message):
    __slots__ = ("participant_id", "session", "round_index", "attempt", "reason")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session: str
    round_index: int
    attempt: int
    reason: str
    def __init__(self, participant_id: _Optional[str] = ..., session: _Optional[str] = ..., round_index: _Optional[int] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class AbstainReply(_message.Message):
    __slots__ = ("outcome", "current_round")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    outcome: str
    current_round: int
    def __init__(self, outcome: _Optional[str] = ..., current_round: _Optional[int] = ...) -> None: ...

class MaskingStagesRequest(_message.Message):
    __slots__ = ("participant_id", "session", "round_index", "attempt")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session: str
    round_index: int
    attempt: int
    def __init__(self, participant_id: _Optional[str] = ..., session: _Optional[str] = ..., round_index: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class PeerCertificate(_message.Message):
    __slots__ = ("participant_id", "certificate_pem")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    certificate_pem: bytes
    def __init__(self, participant_id: _Optional[str] = ..., certificate_pem: _Optional[bytes] = ...) -> None: ...

class MaskingStage(_message.Message):
    __slots__ = ("round_index", "attempt", "group", "stage", "payload", "peers", "deadline_in_s", "closed")
    ROUND_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_IN_S_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    round_index: int
    attempt: int
    group: int
    stage: str
    payload: bytes
    peers: _containers.RepeatedCompositeFieldContainer[PeerCertificate]
    deadline_in_s: float
    closed: bool
    def __init__(self, round_index: _Optional[int] = ..., attempt: _Optional[int] = ..., group: _Optional[int] = ..., stage: _Optional[str] = ..., payload: _Optional[bytes] = ..., peers: _Optional[_Iterable[_Union[PeerCertificate, _Mapping]]] = ..., deadline_in_s: _Optional[float] = ..., closed: _Optional[bool] = ...) -> None: ...

class MaskingAnswerHeader(_message.Message):
    __slots__ = ("participant_id", "session", "round_index", "attempt", "group", "stage", "total_bytes", "payload_hash", "report")
    class ReportEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_HASH_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    participant_id: str
    session: str
    round_index: int
    attempt: int
    group: int
    stage: str
    total_bytes: int
    payload_hash: str
    report: _containers.ScalarMap[str, str]
    def __init__(self, participant_id: _Optional[str] = ..., session: _Optional[str] = ..., round_index: _Optional[int] = ..., attempt: _Optional[int] = ..., group: _Optional[int] = ..., stage: _Optional[str] = ..., total_bytes: _Optional[int] = ..., payload_hash: _Optional[str] = ..., report: _Optional[_Mapping[str, str]] = ...) -> None: ...

class MaskingAnswerChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: MaskingAnswerHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[MaskingAnswerHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class MaskingAnswerReply(_message.Message):
    __slots__ = ("outcome", "current_round")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    outcome: str
    current_round: int
    def __init__(self, outcome: _Optional[str] = ..., current_round: _Optional[int] = ...) -> None: ...
