"""A confluent-kafka Message as the consumer runtime reads it, and a consumer as a forwarding
step uses it, for driving them without a broker."""

from __future__ import annotations

from confluent_kafka import TopicPartition


class FakeMessage:
    def __init__(self, topic: str, partition: int = 0, offset: int = 0, value: bytes = b"",
                 headers: list[tuple[str, bytes]] | None = None, key: bytes | None = None,
                 error: object = None) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._value, self._headers, self._key, self._error = value, headers, key, error

    def error(self) -> object:
        return self._error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value


class FakeConsumer:
    """The consumer calls a forwarding or committing step makes when it rewinds or holds."""

    def __init__(self) -> None:
        self.seeks: list[tuple[str, int, int]] = []
        self.paused: list[tuple[str, int]] = []

    def consumer_group_metadata(self) -> None:
        return None

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused.extend((tp.topic, tp.partition) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        pass
