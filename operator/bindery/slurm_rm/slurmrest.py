"""A small async client of slurmrestd's ``v0.0.38`` API (Slurm 22.05), the part the adapter uses.

slurmrestd answers ``{"errors": [...]}`` next to its data; a non-empty ``errors`` with no data is
raised as :class:`SlurmError` with Slurm's own words, so the adapter can pass them on.
"""

from __future__ import annotations

from typing import Any

import httpx

API = "v0.0.38"
# slurmrestd's answers when slurmctld is down or slow: it tries for ~9 s, then a 500 with one of these.
_CONTROLLER_DOWN = frozenset({-1, 1007, 1008, 5004, 5005})


class SlurmError(RuntimeError):
    """slurmrestd refused or failed a call; the message is Slurm's.

    ``job_id`` is the job slurmctld made anyway: a submission to a node reserved for others answers
    "Required node not available" AND leaves the job pending in the queue (seen on 22.05.8), so the
    caller must cancel it or it may start later for nobody.
    """

    def __init__(self, message: str, *, job_id: int | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


class SlurmUnreachable(SlurmError):
    """slurmrestd (or slurmctld behind it) did not answer."""


def _transport(url: str) -> tuple[httpx.AsyncHTTPTransport, str]:
    if url.startswith("unix:"):
        path = url.removeprefix("unix:").removeprefix("//")
        return httpx.AsyncHTTPTransport(uds=path), "http://slurmrestd"
    return httpx.AsyncHTTPTransport(), url.rstrip("/")


class SlurmRest:
    """slurmrestd at ``url``: ``unix:/path/to/socket`` (rest_auth/local) or ``http(s)://…`` with a JWT."""

    def __init__(self, url: str, *, user: str | None = None, token: str | None = None, timeout: float = 30):
        transport, base = _transport(url)
        headers = {}
        if token:
            headers = {"X-SLURM-USER-NAME": user or "root", "X-SLURM-USER-TOKEN": token}
        self._http = httpx.AsyncClient(transport=transport, base_url=base, headers=headers, timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            response = await self._http.request(method, f"/slurm/{API}{path}", json=body)
        except httpx.HTTPError as error:
            raise SlurmUnreachable(f"slurmrestd did not answer {method} {path}: {error}") from error
        try:
            document: dict[str, Any] = response.json()
        except ValueError:
            raise SlurmError(
                f"slurmrestd answered {method} {path} with {response.status_code}: {response.text[:300]}"
            ) from None
        errors = document.get("errors") or []
        if errors:
            words = "; ".join(
                str(e.get("description") or e.get("error") or e) for e in errors if isinstance(e, dict)
            )
            numbers = {e.get("error_number") for e in errors if isinstance(e, dict)}
            if response.status_code >= 500 and numbers & _CONTROLLER_DOWN:
                raise SlurmUnreachable(f"{method} {path}: {words}")
            made = document.get("job_id")
            raise SlurmError(
                f"{method} {path}: {words}", job_id=made if isinstance(made, int) and made else None
            )
        return document

    async def submit(self, job: dict[str, Any], script: str) -> int:
        document = await self._call("POST", "/job/submit", {"job": job, "script": script})
        return int(document["job_id"])

    async def submit_het(self, components: list[dict[str, Any]], script: str) -> int:
        """A heterogeneous job (``jobs``: one entry per component); the leader's id (component 0)."""
        document = await self._call("POST", "/job/submit", {"jobs": components, "script": script})
        return int(document["job_id"])

    async def het_job(self, leader: int) -> list[dict[str, Any]]:
        """Every component of the heterogeneous job ``leader`` (``GET /job/{leader}`` answers them
        all), by offset; [] when slurmctld does not know it."""
        try:
            document = await self._call("GET", f"/job/{leader}")
        except SlurmError as error:
            if "Invalid job id" in str(error) or "Unable to query JobId" in str(error):
                return []
            raise
        jobs: list[dict[str, Any]] = document.get("jobs") or []
        return sorted(jobs, key=lambda job: int(job.get("het_job_offset") or 0))

    async def update_component(self, leader: int, offset: int, changes: dict[str, Any]) -> None:
        """Update ONE component of a heterogeneous job. ``POST /job/{leader}`` would apply the
        changes (a comment!) to every component; ``{leader}+{offset}`` is slurmctld's name for one
        (``update_job_str``), and the ``+`` must be sent encoded or slurmrestd cannot parse the path."""
        await self._call("POST", f"/job/{leader}%2B{offset}", changes)

    async def job(self, job_id: int) -> dict[str, Any] | None:
        """One job, or None when slurmctld does not know it (never existed or purged after MinJobAge)."""
        try:
            document = await self._call("GET", f"/job/{job_id}")
        except SlurmError as error:
            if "Invalid job id" in str(error) or "Unable to query JobId" in str(error):
                return None
            raise
        jobs: list[dict[str, Any]] = document.get("jobs") or []
        return jobs[0] if jobs else None

    async def jobs(self) -> list[dict[str, Any]]:
        document = await self._call("GET", "/jobs")
        jobs: list[dict[str, Any]] = document.get("jobs") or []
        return jobs

    async def update(self, job_id: int, changes: dict[str, Any]) -> None:
        await self._call("POST", f"/job/{job_id}", changes)

    async def cancel(self, job_id: int) -> None:
        try:
            await self._call("DELETE", f"/job/{job_id}")
        except SlurmError as error:
            if "already completing or completed" in str(error) or "Invalid job id" in str(error):
                return
            raise

    async def nodes(self) -> list[dict[str, Any]]:
        document = await self._call("GET", "/nodes")
        nodes: list[dict[str, Any]] = document.get("nodes") or []
        return nodes
