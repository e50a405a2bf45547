"""Fetch the RM credentials a ResourceManager references and hand them to the client as files.

The RM client takes a token string and file paths (httpx/ssl load certificates from files), so
TLS material from Secrets is written to a private directory (0700, files 0600), one sub-directory
per ResourceManager. Secrets are read when a profile is built and again at every readiness probe
(`probe_interval`, 30 s by default): a rotated token or certificate gets a new RM client without a
restart or an edit of the ResourceManager.

Secrets opt in. A ResourceManager names its endpoint and its Secrets, and whoever may write a
ResourceManager is not necessarily allowed to read every Secret the operator can read: without a
check, `tokenSecretRef` pointing at someone else's Secret would make the operator send its value to
an endpoint of the author's choosing. So only a Secret labelled `CREDENTIALS_LABEL=true` is used;
labelling one is the owner's statement that it is meant for a resource manager. For the same
reason no message ever lists what an unused Secret contains (not even its key names).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import pathlib
from collections.abc import Awaitable, Callable

from bindery.apiserver import ApiClient, ApiError, get, resources
from bindery.config import ResourceManagerConfig, SecretKeyRef
from bindery.rm.client import Negotiation, ResourceManagerClient
from bindery.rm.models import Reservation

#: The label (value "true") by which a Secret's owner lets Bindery use it as RM credentials.
CREDENTIALS_LABEL = "bindery.dev/credentials"

#: Bound of one Secret read: a hung apiserver connection must not freeze a ResourceManager's loop.
READ_TIMEOUT_SECONDS = 10.0


class CredentialsError(RuntimeError):
    """A referenced Secret or key is missing; the message names it."""


@dataclasses.dataclass(frozen=True)
class RMCredentials:
    token: str | None = None
    ca_file: pathlib.Path | None = None
    client_cert: tuple[pathlib.Path, pathlib.Path] | None = None
    #: changes whenever any secret material changes, the CA included (file paths stay the same
    #: across rotations, so the digest is what tells the supervisor to build a new client)
    digest: str = ""


async def resolve_credentials(
    *, api: ApiClient, config: ResourceManagerConfig, directory: pathlib.Path
) -> RMCredentials:
    core = api
    target = directory / config.name
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    material = hashlib.sha256()
    token = await read_token(api=core, config=config)
    if token is not None:
        material.update(b"token\0" + token.encode())
    ca_file = None
    ca: bytes | None = None
    if config.ca_bundle is not None:
        ca = config.ca_bundle.encode()
    elif config.ca_ref is not None:
        ca = await _secret_value(core=core, ref=config.ca_ref, what="CA bundle")
    if ca is not None:  # in the digest too: a CA rotated in place needs a new client like a token
        material.update(b"ca\0" + ca + b"\0")
        ca_file = _write(target / "ca.crt", ca)
    client_cert = None
    if config.client_cert_ref is not None:
        ref = config.client_cert_ref
        cert = await _secret_value(core=core, ref=dataclasses.replace(ref, key="tls.crt"), what="client cert")
        key = await _secret_value(core=core, ref=dataclasses.replace(ref, key="tls.key"), what="client key")
        material.update(b"cert\0" + cert + b"key\0" + key)
        client_cert = (_write(target / "tls.crt", cert), _write(target / "tls.key", key))
    return RMCredentials(token=token, ca_file=ca_file, client_cert=client_cert, digest=material.hexdigest())


async def read_token(*, api: ApiClient, config: ResourceManagerConfig) -> str | None:
    """The bearer token the ResourceManager's Secret holds now (None: it references none)."""
    if config.token_ref is None:
        return None
    return (await _secret_value(core=api, ref=config.token_ref, what="bearer token")).decode().strip()


async def _secret_value(*, core: ApiClient, ref: SecretKeyRef, what: str) -> bytes:
    try:
        secret = await get(
            core,
            resources.SECRETS,
            namespace=ref.namespace,
            name=ref.name,
            request_timeout=READ_TIMEOUT_SECONDS,
        )
    except ApiError as exc:
        if not exc.status:  # no answer (a timeout, a transport error): the caller retries with backoff
            raise CredentialsError(
                f"cannot read Secret {ref.namespace}/{ref.name} for the {what}: the apiserver did not answer "
                f"within {READ_TIMEOUT_SECONDS:g} s ({exc.message}); retrying"
            ) from exc
        raise CredentialsError(
            f"cannot read Secret {ref.namespace}/{ref.name} for the {what}: HTTP {exc.status} "
            f"{exc.reason or exc.message}; create it, or grant the operator `get` on it"
        ) from exc
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if labels.get(CREDENTIALS_LABEL) != "true":
        raise CredentialsError(
            f"Secret {ref.namespace}/{ref.name} is not labelled {CREDENTIALS_LABEL}=true, so Bindery does "
            f"not use it for the {what} (the label is its owner's consent to send it to a resource "
            f"manager); if it is meant for this one, run: kubectl label secret -n {ref.namespace} "
            f"{ref.name} {CREDENTIALS_LABEL}=true"
        )
    data = secret.get("data") or {}
    if ref.key not in data:  # never list the keys it has: the status is readable by more people
        raise CredentialsError(
            f"Secret {ref.namespace}/{ref.name} has no key {ref.key!r} for the {what}; add the key to the "
            f"Secret or name the right one in the ResourceManager's reference (`key`)"
        )
    return base64.b64decode(data[ref.key])


def _write(path: pathlib.Path, data: bytes) -> pathlib.Path:
    path.touch(mode=0o600, exist_ok=True)
    path.write_bytes(data)
    return path


def rm_client_for(
    *,
    config: ResourceManagerConfig,
    credentials: RMCredentials,
    cluster_id: str | None = None,
    previous_token: str | None = None,
    on_unauthorized: Callable[[], Awaitable[str | None]] | None = None,
    negotiation: Negotiation | None = None,
) -> ResourceManagerClient:
    """The RM client a ResourceManager's spec and its resolved credentials describe.

    One place, so the operator and `bindery audit` reach an RM the same way. With `cluster_id`, an
    RM that speaks contract v1.2 gets it on every reserve and lists only that cluster's
    reservations. `previous_token` and `on_unauthorized` are the client's 401 handling (see
    `bindery.rm.client.TokenSource`); `negotiation` what the RM said of its contract to an earlier
    client (`bindery.rm.client.Negotiation`). Raises ValueError or OSError for an endpoint or TLS material
    the client refuses.
    """
    return ResourceManagerClient(
        base_url=config.endpoint,
        token=credentials.token,
        previous_token=previous_token if previous_token != credentials.token else None,
        on_unauthorized=on_unauthorized,
        ca_file=credentials.ca_file,
        client_cert=credentials.client_cert,
        connect_timeout=config.connect_timeout,
        read_timeout=config.read_timeout,
        allow_insecure_http=config.allow_insecure_http,
        cluster_id=cluster_id,
        negotiation=negotiation,
    )


async def reservations_at(
    *,
    api: ApiClient,
    config: ResourceManagerConfig,
    directory: pathlib.Path,
    scheduler_name: str | None = None,
    cluster_id: str | None = None,
) -> list[Reservation]:
    """What the RM of a ResourceManager lists, asked as the operator asks it (read-only tooling):
    with `cluster_id`, only that cluster's reservations when the RM speaks contract v1.2.

    Raises CredentialsError, RMError, ValueError or OSError (see `rm_client_for`).
    """
    credentials = await resolve_credentials(api=api, config=config, directory=directory)
    async with rm_client_for(config=config, credentials=credentials, cluster_id=cluster_id) as rm:
        return await rm.list_reservations(scheduler_name=scheduler_name)
