# Types of the C extension redrive._headers (src/redrive/_headers.c).
from collections.abc import Mapping, Sequence

from redrive.record import Delivery

def read_delivery(headers: Sequence[tuple[str, bytes | None]]) -> Delivery | None: ...
def replace(headers: Sequence[tuple[str, bytes | None]],
            updates: Mapping[str, str | int | bytes | None]
            ) -> list[tuple[str, bytes | None]] | None: ...
