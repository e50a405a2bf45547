"""The RM bearer token: inline or from a mounted Secret file, re-read when it changes.

Apart from the client because rotation is its own state machine: after a 401 it decides which
token to try next, so a rotation fails no call whichever side (the RM or the Secret) changes first.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
from collections.abc import Awaitable, Callable

from bindery.rm.errors import RMError

__all__ = ["REREAD_INTERVAL", "TokenSource"]


#: After a 401, the callback that re-reads the token is asked at most once per this many seconds.
REREAD_INTERVAL = 1.0


class TokenSource:
    """A bearer token given inline or read from a file, re-read whenever the file changes.

    An inline token may come with the previous one and a callback that re-reads the current one
    (the operator's Secret read): after a 401 :meth:`after_refusal` picks the token to try next, so
    a rotation fails no call whichever side, the RM or the Secret, changes first.
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        token_file: pathlib.Path | None = None,
        previous: str | None = None,
        reread: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        if token is not None and token_file is not None:
            raise ValueError("give the RM bearer token either inline or as a file, not both")
        self._token = token.strip() if token is not None else None
        self._file = token_file
        self._stamp: tuple[int, int, int] | None = None
        self._previous = previous.strip() if previous else None
        self._reread = reread
        self._reread_at = float("-inf")
        self._lock = asyncio.Lock()

    @property
    def from_file(self) -> bool:
        return self._file is not None

    def current(self, *, force_reload: bool = False) -> str | None:
        if self._file is None:
            return self._token
        try:
            stat = os.stat(self._file)
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            if force_reload or stamp != self._stamp:
                self._token = self._file.read_text(encoding="utf-8").strip()
                self._stamp = stamp
        except OSError as error:
            raise RMError(
                f"cannot read the RM bearer token from {self._file}: {error.strerror or error}; "
                "check that the Secret is mounted there"
            ) from None
        return self._token or None

    async def after_refusal(self, refused: str | None) -> bool:
        """The RM answered 401 to `refused`: whether another token is now current (worth one retry).

        Concurrent refusals share one re-read: a call that waited finds the token already switched.
        """
        if self._file is not None:
            # The token may have rotated within the file's mtime granularity: re-read once.
            self.current(force_reload=True)
            return True
        async with self._lock:
            if refused != self._token:
                return self._token is not None  # another call switched already
            now = asyncio.get_running_loop().time()
            if self._reread is not None and now - self._reread_at >= REREAD_INTERVAL:
                self._reread_at = now
                fresh = await self._reread()
                if fresh and fresh.strip() != self._token:
                    self._previous, self._token = self._token, fresh.strip()
                    return True
            if self._previous and self._previous != self._token:
                # The caller's Secret changed before the RM's token did: the previous one still works.
                self._previous, self._token = self._token, self._previous
                return True
            return False
