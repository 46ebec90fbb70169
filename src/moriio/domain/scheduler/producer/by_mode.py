"""The producer book for a transfer mode, chosen once where the scheduler side is built."""

from __future__ import annotations

from moriio.domain.scheduler.producer.book import LocalEndpoint, ProducerBook
from moriio.domain.scheduler.producer.read_book import ReadProducerBook
from moriio.domain.scheduler.producer.write_book import WriteProducerBook
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.values.modes import TransferMode

PRODUCER_BOOKS: dict[TransferMode, type[ProducerBook]] = {
    TransferMode.READ: ReadProducerBook,
    TransferMode.WRITE: WriteProducerBook,
}


def producer_book(
    mode: TransferMode, endpoint: LocalEndpoint, policy: TransferPolicy
) -> ProducerBook:
    """A READ book (holds blocks for pulling consumers) or a WRITE book (orders pushes)."""
    return PRODUCER_BOOKS[mode](endpoint, policy)
