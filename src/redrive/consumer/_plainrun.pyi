# Types of the C extension redrive.consumer._plainrun (src/redrive/consumer/_plainrun.c).
from collections.abc import Sequence

from confluent_kafka import Message

from redrive.consumer.plain import Handler, PlainRun

def handle_plain(messages: Sequence[Message], start: int, topic: str, partition: int,
                 handler: Handler, until_sample: int, sample_every: int, times: list[float],
                 stop: bytearray) -> PlainRun: ...
