"""Raw requests to the apiserver: JSON in, JSON out, one error hierarchy, every LIST paged.

Bindery reads objects as the JSON the apiserver sends (``kubernetes_asyncio``'s model classes
parse every timestamp, and the code reads a handful of fields), so the generated per-resource
methods bought nothing but a second spelling of every path. The client's REST layer is kept for
what it does well: its aiohttp session, TLS settings, proxy, ``tls_server_name`` and timeout
handling, with the same authentication (``update_params_for_auth``: the bearer token, refreshed by
the configuration's hook) and default headers (``User-Agent``). Requests skip the generated
methods' per-call machinery (checking keyword arguments, walking the body through
``sanitize_for_serialization``, building parameter tuples): about 0.1 ms of a ~0.8 ms POST on
loopback, on the two writes every scheduled pod costs (benchmarks/PROFILE.md; this was
``bindery.adapters.post``).

Every failure leaves as an :class:`bindery.apiserver.errors.ApiError` (see :func:`translate`). Every LIST
goes through :func:`list_pages` (``limit`` + ``continue``): an unpaged list of 50,000 pods is one
response body of hundreds of megabytes held at once, on the apiserver and here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from typing import Any, TypeAlias

import aiohttp
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient as _ApiClient
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.client.exceptions import ApiException

from bindery.apiserver.errors import Unavailable, from_status, translate
from bindery.apiserver.resources import Resource

__all__ = [
    "DEFAULT_TIMEOUT",
    "JSON_PATCH",
    "MERGE_PATCH",
    "METADATA_ONLY",
    "METADATA_ONLY_WATCH",
    "PAGE_SIZE",
    "STRATEGIC_PATCH",
    "ApiClient",
    "Listing",
    "Timeout",
    "answer_of",
    "client_for",
    "client_from",
    "create",
    "delete",
    "get",
    "list_all",
    "list_pages",
    "patch",
    "replace",
    "request",
    "response",
    "selectors",
]

#: The client the layer is given (``kubernetes_asyncio.client.ApiClient``); callers name it from here.
ApiClient: TypeAlias = _ApiClient
Timeout: TypeAlias = float | aiohttp.ClientTimeout | None
#: Bound of one request unless the caller says otherwise: none of Bindery's reads may hang for ever.
DEFAULT_TIMEOUT = 60.0
#: One page of a LIST, for most resources (``Resource.page_size``; pods have their own).
PAGE_SIZE = 500
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
#: Ask for PartialObjectMetadata(List): only ``metadata`` of each object, for callers reading nothing else.
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
METADATA_ONLY_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


def client_for(configuration: Any) -> ApiClient:
    """A client for a ``kubernetes_asyncio`` Configuration (as :mod:`bindery.controller.startup.connection`
    loads it); use it as an async context manager, or ``await client.close()``."""
    return _ApiClient(configuration=configuration)


async def client_from(*, kubeconfig: str | None) -> ApiClient:
    """A client for `kubeconfig`, or the pod's in-cluster service account if None. A plain load:
    the operator's own (token file rotation, proxies) is :mod:`bindery.controller.startup.connection`'s."""
    configuration = Configuration()
    if kubeconfig is not None:
        await kube_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        kube_config.load_incluster_config(client_configuration=configuration)
    return _ApiClient(configuration=configuration)


Query: TypeAlias = Mapping[str, str | int | bool] | Iterable[tuple[str, str | int | bool]]
#: The generated client's auth setting for a kubeconfig's token (client certificates live in the
#: session's TLS context and need nothing per request).
_AUTH = ["BearerToken"]


def _query(query: Query | None) -> list[tuple[str, str]]:
    pairs = query.items() if isinstance(query, Mapping) else (query or ())
    return [(key, ("true" if v else "false") if isinstance(v, bool) else str(v)) for key, v in pairs]


async def _send(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: Query | None,
    body: Any,
    content_type: str,
    accept: str,
    request_timeout: Timeout,
) -> aiohttp.ClientResponse:
    """The raw response (any status); raises what the REST layer raises on a transport failure."""
    headers: dict[str, str] = {**api.default_headers, "Accept": accept, "Content-Type": content_type}
    if api.cookie:
        headers["Cookie"] = api.cookie
    await api.update_params_for_auth(headers, None, _AUTH)
    return await api.rest_client.request(  # type: ignore[no-any-return]
        method,
        api.configuration.host + path,
        query_params=_query(query) or None,
        headers=headers,
        body=body,
        _preload_content=False,
        _request_timeout=request_timeout,
    )


@contextlib.asynccontextmanager
async def response(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: Query | None = None,
    body: Any = None,
    content_type: str = "application/json",
    accept: str = "application/json",
    request_timeout: Timeout = DEFAULT_TIMEOUT,
    what: str = "",
) -> AsyncIterator[aiohttp.ClientResponse]:
    """The open response of a request that answered 2xx (a watch's stream, say); released after.

    Raises :class:`ApiError` for any other answer or a transport failure.
    """
    what = what or f"{method} {path}"
    try:
        answer = await _send(
            api,
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            accept=accept,
            request_timeout=request_timeout,
        )
    except (ApiException, aiohttp.ClientError, TimeoutError, OSError) as error:
        raise translate(error, what=what) from error
    try:
        if not 200 <= answer.status <= 299:
            try:
                data = await answer.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                raise translate(error, what=what) from error
            raise from_status(answer.status, data, headers=answer.headers, what=what)
        yield answer
    finally:
        answer.release()


async def answer_of(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: Query | None = None,
    body: Any = None,
    accept: str = "application/json",
    request_timeout: Timeout = DEFAULT_TIMEOUT,
    what: str = "",
) -> tuple[int, bytes]:
    """(status, body) of one request whatever the status, for callers that read a non-2xx answer
    themselves (a Binding's 409, a service proxied by the apiserver); only a failure to get an
    answer raises (:class:`Unavailable`). `path` is already percent-encoded."""
    what = what or f"{method} {path}"
    try:
        answer = await _send(
            api,
            method,
            path,
            query=query,
            body=body,
            content_type="application/json",
            accept=accept,
            request_timeout=request_timeout,
        )
        try:
            return answer.status, await answer.read()
        finally:
            answer.release()
    except (ApiException, aiohttp.ClientError, TimeoutError, OSError) as error:
        raise translate(error, what=what) from error


async def request(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: Query | None = None,
    body: Any = None,
    content_type: str = "application/json",
    accept: str = "application/json",
    request_timeout: Timeout = DEFAULT_TIMEOUT,
    what: str = "",
) -> dict[str, Any]:
    """One request; the JSON object it answered (``{}`` for an empty body)."""
    what = what or f"{method} {path}"
    async with response(
        api,
        method,
        path,
        query=query,
        body=body,
        content_type=content_type,
        accept=accept,
        request_timeout=request_timeout,
        what=what,
    ) as answer:
        try:
            data = await answer.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise translate(error, what=what) from error
    if not data.strip():
        return {}
    try:
        document = json.loads(data)
    except ValueError as error:
        raise Unavailable(f"the answer is not JSON: {data[:200]!r}", what=what) from error
    if not isinstance(document, dict):
        raise Unavailable(f"the answer is not a JSON object: {data[:200]!r}", what=what)
    return document


async def get(
    api: ApiClient,
    resource: Resource,
    *,
    name: str,
    namespace: str | None = None,
    subresource: str = "",
    request_timeout: Timeout = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """The object (raises :class:`bindery.apiserver.errors.NotFound` if it does not exist)."""
    path = resource.path(namespace=namespace, name=name, subresource=subresource)
    return await request(api, "GET", path, request_timeout=request_timeout)


async def create(
    api: ApiClient,
    resource: Resource,
    *,
    body: Mapping[str, Any],
    namespace: str | None = None,
    name: str | None = None,
    subresource: str = "",
    request_timeout: Timeout = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """POST `body` to the collection (or to `name`'s `subresource`, e.g. a pod's ``binding``)."""
    path = resource.path(namespace=namespace, name=name, subresource=subresource)
    return await request(api, "POST", path, body=dict(body), request_timeout=request_timeout)


async def replace(
    api: ApiClient,
    resource: Resource,
    *,
    name: str,
    body: Mapping[str, Any],
    namespace: str | None = None,
    subresource: str = "",
    request_timeout: Timeout = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """PUT `body` (a stale ``metadata.resourceVersion`` raises :class:`Conflict`)."""
    path = resource.path(namespace=namespace, name=name, subresource=subresource)
    return await request(api, "PUT", path, body=dict(body), request_timeout=request_timeout)


async def patch(
    api: ApiClient,
    resource: Resource,
    *,
    name: str,
    body: Any,
    namespace: str | None = None,
    subresource: str = "",
    content_type: str = MERGE_PATCH,
    request_timeout: Timeout = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """PATCH the object (a merge patch unless `content_type` says otherwise)."""
    path = resource.path(namespace=namespace, name=name, subresource=subresource)
    return await request(
        api, "PATCH", path, body=body, content_type=content_type, request_timeout=request_timeout
    )


async def delete(
    api: ApiClient,
    resource: Resource,
    *,
    name: str,
    namespace: str | None = None,
    body: Mapping[str, Any] | None = None,
    request_timeout: Timeout = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """DELETE the object (`body`: DeleteOptions such as preconditions or a grace period)."""
    path = resource.path(namespace=namespace, name=name)
    return await request(
        api, "DELETE", path, body=dict(body) if body else None, request_timeout=request_timeout
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Listing:
    """Every object of a (paged) LIST, and the resourceVersion of the list's snapshot."""

    items: list[dict[str, Any]]
    resource_version: str


def selectors(*, label_selector: str = "", field_selector: str = "") -> dict[str, str]:
    """Pure: the query parameters of the given selectors (the empty ones left out)."""
    query = {}
    if label_selector:
        query["labelSelector"] = label_selector
    if field_selector:
        query["fieldSelector"] = field_selector
    return query


async def list_pages(
    api: ApiClient,
    resource: Resource,
    *,
    namespace: str | None = None,
    label_selector: str = "",
    field_selector: str = "",
    metadata_only: bool = False,
    page_size: int | None = None,
    request_timeout: Timeout = DEFAULT_TIMEOUT,
) -> AsyncGenerator[dict[str, Any], None]:
    """Each page (a ``...List`` document) of one LIST, following ``continue`` to the last.

    All pages are of one snapshot: the apiserver pins the first page's resourceVersion in the
    token. A token that expired mid-list (410) raises :class:`bindery.apiserver.errors.Gone`: list again.
    `request_timeout` bounds each page; `page_size` defaults to the resource's (pods: fewer).
    """
    path = resource.path(namespace=namespace)
    query: dict[str, str | int | bool] = {
        **selectors(label_selector=label_selector, field_selector=field_selector),
        "limit": page_size or resource.page_size,
    }
    accept = METADATA_ONLY if metadata_only else "application/json"
    while True:
        page = await request(api, "GET", path, query=query, accept=accept, request_timeout=request_timeout)
        token = str((page.get("metadata") or {}).get("continue") or "")
        yield page
        del page  # before the next page is read: a caller that dropped it holds one page, not two
        if not token:
            return
        query["continue"] = token


async def list_all(
    api: ApiClient,
    resource: Resource,
    *,
    namespace: str | None = None,
    label_selector: str = "",
    field_selector: str = "",
    metadata_only: bool = False,
    page_size: int | None = None,
    request_timeout: Timeout = DEFAULT_TIMEOUT,
) -> Listing:
    """Every object of one (paged) LIST, with the snapshot's resourceVersion."""
    items: list[dict[str, Any]] = []
    version = ""
    async for page in list_pages(
        api,
        resource,
        namespace=namespace,
        label_selector=label_selector,
        field_selector=field_selector,
        metadata_only=metadata_only,
        page_size=page_size,
        request_timeout=request_timeout,
    ):
        items.extend(page.get("items") or ())
        version = version or str((page.get("metadata") or {}).get("resourceVersion") or "")
    return Listing(items=items, resource_version=version)
