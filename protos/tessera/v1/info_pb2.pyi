from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GetVersionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VersionInfo(_message.Message):
    __slots__ = ("component", "version", "git_commit", "python_version", "grpc_version", "protobuf_version", "start_time")
    COMPONENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GIT_COMMIT_FIELD_NUMBER: _ClassVar[int]
    PYTHON_VERSION_FIELD_NUMBER: _ClassVar[int]
    GRPC_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOBUF_VERSION_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    component: str
    version: str
    git_commit: str
    python_version: str
    grpc_version: str
    protobuf_version: str
    start_time: float
    def __init__(self, component: _Optional[str] = ..., version: _Optional[str] = ..., git_commit: _Optional[str] = ..., python_version: _Optional[str] = ..., grpc_version: _Optional[str] = ..., protobuf_version: _Optional[str] = ..., start_time: _Optional[float] = ...) -> None: ...
