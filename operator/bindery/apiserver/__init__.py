"""Raw apiserver I/O: the only package that imports ``kubernetes_asyncio`` (see pyproject's
import-linter contracts), below every room that talks to the apiserver.

- :mod:`bindery.apiserver.errors`: one error hierarchy (:class:`ApiError`: :class:`Unavailable` or
  :class:`Rejected`, with :class:`NotFound`, :class:`Conflict`...), one translation.
- :mod:`bindery.apiserver.resources`: one constant per API resource (``PODS``, ``RESOURCE_MANAGERS``...).
- :mod:`bindery.apiserver.api`: get/create/replace/patch/delete and the paged LIST, JSON in and out.
- :mod:`bindery.apiserver.watching`: the one list-then-watch loop (resume, bookmarks, diff on 410).

Converting a caller (the generated call → the layer's)::

    client.ApiClient(configuration=c)              client_for(c)
    CoreV1Api(api).read_namespaced_pod(n, ns)      get(api, resources.PODS, namespace=ns, name=n)
    ... except ApiException as e: if e.status==404 except NotFound:
    list_namespaced_pod(ns, limit=, _continue=)    list_all(api, resources.PODS, namespace=ns,
                                                     field_selector=..., metadata_only=True)
    CustomObjectsApi.get_namespaced_custom_object  get(api, resources.PODGROUPS, namespace=, name=)
    patch_namespaced_custom_object_status          patch(api, resources.PODGROUPS, namespace=, name=,
                                                     subresource="status", body=...)  # merge patch
    patch_namespaced_pod_status (a dict body)      patch(..., content_type=api.STRATEGIC_PATCH)
    _request_timeout=s                             request_timeout=s
"""

from bindery.apiserver.api import (
    ApiClient,
    Listing,
    answer_of,
    client_for,
    client_from,
    create,
    delete,
    get,
    list_all,
    list_pages,
    patch,
    replace,
    request,
)
from bindery.apiserver.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    Rejected,
    TooLarge,
    Unauthorized,
    Unavailable,
    translate,
)
from bindery.apiserver.watching import WATCH_BACKOFF, Cursor, Event, Listed, list_watch

__all__ = [
    "WATCH_BACKOFF",
    "ApiClient",
    "ApiError",
    "BadRequest",
    "Conflict",
    "Cursor",
    "Event",
    "Forbidden",
    "Gone",
    "Invalid",
    "Listed",
    "Listing",
    "NotFound",
    "Rejected",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "answer_of",
    "client_for",
    "client_from",
    "create",
    "delete",
    "get",
    "list_all",
    "list_pages",
    "list_watch",
    "patch",
    "replace",
    "request",
    "translate",
]
