# Types of the C extension redrive.spark._rangeread (src/redrive/_rangeread.c).
from collections.abc import Sequence

# (validity bitmap or None when no value is null, int32 offsets, data, null count)
BinaryBuffers = tuple[bytes | None, bytes, bytes, int]
# (list validity or None, null lists, int32 list offsets, header count, names, values)
HeaderBuffers = tuple[bytes | None, int, bytes, int, BinaryBuffers, BinaryBuffers]
# (rows, keys, values, int64 offsets, int64 timestamps in us, int32 timestamp types, headers)
BatchBuffers = tuple[int, BinaryBuffers, BinaryBuffers, bytes, bytes, bytes, HeaderBuffers | None]

class ReadError(RuntimeError): ...

class RangeReader:
    def __init__(self, config: Sequence[tuple[str, str]], topic: str, partition: int,
                 start: int, end: int, include_headers: bool, poll_timeout_ms: int,
                 skip_lost: bool) -> None: ...
    def read(self, max_rows: int, max_bytes: int) -> BatchBuffers | None: ...
    def close(self) -> None: ...

def librdkafka_version() -> str: ...
