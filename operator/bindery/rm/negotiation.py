"""What one RM has said of its contract (``GET /v1/info``), kept across the clients built for it.

Apart from the client because the operator keeps it longer than any client: a rotated Secret builds
a new client, and the contract the RM offered before must not be forgotten with the old one.
"""

from __future__ import annotations

from bindery.rm.models import ContractInfo

__all__ = ["Negotiation", "contract_version"]


class Negotiation:
    """What one RM has said of its contract, kept by whoever outlives a client.

    A rotated Secret builds a new client for the same RM; handed the ResourceManager's
    ``Negotiation``, it starts from the contract the RM offered before rather than from nothing,
    so a 404 met first by the new client (a v1.1 replica mid-rollout) does not make it v1.1 either.
    ``info`` is the last 200 answer to ``GET /v1/info``; ``legacy_since`` the loop time of the first
    no-such-path answer before any 200, ``legacy`` whether a second one, asked later, confirmed it.
    """

    def __init__(self) -> None:
        self.info: ContractInfo | None = None
        self.legacy_since: float | None = None
        self.legacy = False
        #: an error answer was met since the last 200 and logged (one warning per episode)
        self.doubted = False

    @property
    def known(self) -> bool:
        """Whether the contract is settled: a 200 answer, or a confirmed v1.1 verdict."""
        return self.info is not None or self.legacy


def contract_version(text: str) -> tuple[int, ...]:
    """``"1.2.0"`` → ``(1, 2, 0)``, ``"1.3.0-rc1"`` → ``(1, 3, 0)``: the leading numbers only, so a
    suffix never reads as a downgrade."""
    numbers: list[int] = []
    for part in text.split("."):
        digits = len(part) - len(part.lstrip("0123456789"))
        if digits == 0:
            break
        numbers.append(int(part[:digits]))
        if digits < len(part):
            break
    return tuple(numbers)
