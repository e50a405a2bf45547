"""Rotating the RM bearer token fails no call (issue 20, scenario 10), shown on the reference RM.

Three pieces, each needed for one order of events during a rotation:

- the RM rotates first: it keeps accepting the previous token for an overlap (`token_overlap`), so
  a caller that has not re-read its Secret yet is not refused;
- the caller's Secret changes first, or the overlap ended: after a 401 the client asks for the
  current token at once (the operator re-reads the Secret) and, if the RM refuses that one too
  (it has not seen the new token yet), tries the previous one;
- a wrong token shows in the readiness probe, which authenticates, instead of only in failed pods.
"""

from __future__ import annotations

import os
import pathlib

import pytest

from bindery.reference_rm.server import serve_reference_rm
from bindery.rm.client import ResourceManagerClient
from bindery.rm.errors import RMError
from tests.rm.conftest import small_inventory


def _rotate(path: pathlib.Path, token: str) -> None:
    """Replace the file in one rename (as the kubelet's atomic writer does)."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_text(token)
    os.replace(staged, path)


async def test_the_reference_rm_accepts_the_previous_token_during_the_overlap(tmp_path: pathlib.Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("one")
    async with (
        serve_reference_rm(
            db_path=tmp_path / "rm.sqlite",
            inventory=small_inventory(),
            token_file=token_file,
            token_overlap=600.0,
        ) as server,
        ResourceManagerClient(base_url=server.url, token="one", allow_insecure_http=True) as old,
    ):
        await old.list_reservations()
        _rotate(token_file, "two")
        async with ResourceManagerClient(base_url=server.url, token="two", allow_insecure_http=True) as new:
            await new.list_reservations()  # the new token works at once
        await old.list_reservations()  # and the previous one still does, for the overlap


async def test_without_an_overlap_the_previous_token_is_refused(tmp_path: pathlib.Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("one")
    async with serve_reference_rm(
        db_path=tmp_path / "rm.sqlite", inventory=small_inventory(), token_file=token_file, token_overlap=0.0
    ) as server:
        _rotate(token_file, "two")
        async with ResourceManagerClient(base_url=server.url, token="one", allow_insecure_http=True) as old:
            with pytest.raises(RMError, match="HTTP 401"):
                await old.list_reservations()


async def test_after_a_401_the_client_asks_for_the_current_token_and_falls_back_to_the_previous(
    tmp_path: pathlib.Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("one")
    secret = {"token": "one"}  # what the operator's Secret holds
    asked: list[str] = []

    async def reread() -> str | None:
        asked.append(secret["token"])
        return secret["token"]

    async with (
        serve_reference_rm(
            db_path=tmp_path / "rm.sqlite",
            inventory=small_inventory(),
            token_file=token_file,
            token_overlap=0.0,
        ) as server,
        ResourceManagerClient(
            base_url=server.url, token="one", on_unauthorized=reread, allow_insecure_http=True
        ) as client,
    ):
        await client.list_reservations()
        assert asked == []
        # The RM rotated first (no overlap): the client re-reads the Secret at the 401 and retries.
        secret["token"] = "two"
        _rotate(token_file, "two")
        await client.list_reservations()
        assert asked == ["two"]
        # The Secret changed first: the RM refuses "three", the previous token ("two") still works.
        secret["token"] = "three"
        async with ResourceManagerClient(
            base_url=server.url,
            token="three",
            previous_token="two",
            on_unauthorized=reread,
            allow_insecure_http=True,
        ) as rotated:
            await rotated.list_reservations()


async def test_the_readiness_probe_authenticates(tmp_path: pathlib.Path) -> None:
    async with (
        serve_reference_rm(
            db_path=tmp_path / "rm.sqlite", inventory=small_inventory(), token="right"
        ) as server,
        ResourceManagerClient(base_url=server.url, token="wrong", allow_insecure_http=True) as client,
    ):
        with pytest.raises(RMError, match="refused the bearer token"):
            await client.check_ready()
