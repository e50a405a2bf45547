"""The raw apiserver layer's pure parts: error translation, paths, the watch bookkeeping and diff."""

from __future__ import annotations

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from bindery.apiserver import errors, resources
from bindery.apiserver.watching import Cursor, Event, identity, parse_line
from bindery.backoff import Backoff, BackoffPolicy


def _status(code: int, reason: str, message: str) -> str:
    return f'{{"kind": "Status", "code": {code}, "reason": "{reason}", "message": "{message}"}}'


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, errors.BadRequest),
        (401, errors.Unauthorized),
        (403, errors.Forbidden),
        (404, errors.NotFound),
        (409, errors.Conflict),
        (410, errors.Gone),
        (413, errors.TooLarge),
        (422, errors.Invalid),
        (418, errors.BadRequest),
        (429, errors.Unavailable),
        (500, errors.Unavailable),
        (503, errors.Unavailable),
    ],
)
def test_each_status_has_its_error(status: int, kind: type[errors.ApiError]) -> None:
    error = errors.from_status(status, _status(status, "Why", "because"), what="GET /x")
    assert type(error) is kind
    assert (error.status, error.reason, error.message) == (status, "Why", "because")
    assert str(error) == "GET /x: because"
    assert isinstance(error, errors.Unavailable if status == 429 or status >= 500 else errors.Rejected)


def test_retry_after_is_carried_by_unavailable_only_where_given() -> None:
    error = errors.from_status(429, b"{}", headers={"Retry-After": "3"})
    assert isinstance(error, errors.Unavailable)
    assert error.retry_after == 3.0
    assert errors.from_status(503, b"").retry_after is None  # type: ignore[attr-defined]
    assert errors.from_status(503, b"", headers={"Retry-After": "Wed, 21 Oct 2015"}).retry_after is None  # type: ignore[attr-defined]


def test_a_body_that_is_not_a_status_becomes_the_message() -> None:
    error = errors.from_status(502, b"<html>bad gateway</html>")
    assert error.message == "<html>bad gateway</html>"
    assert errors.from_status(404, b"").message == "HTTP 404"


def test_translate_covers_the_clients_exceptions_and_transport_errors() -> None:
    api_exception = ApiException(status=409, reason="Conflict")
    api_exception.body = _status(409, "AlreadyExists", "pod a already exists").encode()
    conflict = errors.translate(api_exception)
    assert isinstance(conflict, errors.Conflict)
    assert conflict.reason == "AlreadyExists"
    assert isinstance(errors.translate(ApiException(status=0, reason="no answer")), errors.Unavailable)
    assert isinstance(errors.translate(aiohttp.ClientConnectionError("refused")), errors.Unavailable)
    assert isinstance(errors.translate(TimeoutError()), errors.Unavailable)
    assert isinstance(errors.translate(aiohttp.ServerTimeoutError("read")), errors.Unavailable)
    same = errors.NotFound("gone")
    assert errors.translate(same) is same
    with pytest.raises(TypeError):
        errors.translate(KeyError("a bug, not an apiserver failure"))


def test_paths() -> None:
    assert resources.PODS.path() == "/api/v1/pods"
    assert resources.PODS.path(namespace="ns") == "/api/v1/namespaces/ns/pods"
    assert resources.PODS.path(namespace="ns", name="p", subresource="binding") == (
        "/api/v1/namespaces/ns/pods/p/binding"
    )
    assert resources.RESOURCE_MANAGERS.path(name="rm", subresource="status") == (
        "/apis/bindery.dev/v1alpha1/resourcemanagers/rm/status"
    )
    assert resources.LEASES.path(namespace="kube-system", name="l") == (
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l"
    )
    assert resources.RESOURCE_MANAGERS.api_version == "bindery.dev/v1alpha1"
    with pytest.raises(ValueError, match="cluster-scoped"):
        resources.NODES.path(namespace="ns")
    with pytest.raises(ValueError, match="namespaced"):
        resources.PODS.path(name="p")


def obj(name: str, version: str, **extra: object) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": version},
        **extra,
    }


def test_the_first_list_delivers_every_object_as_listed() -> None:
    cursor = Cursor()
    events = cursor.listed([obj("a", "1"), obj("b", "2")], resource_version="5")
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [(None, "a"), (None, "b")]
    assert (cursor.resource_version, cursor.must_list, cursor.lists) == ("5", False, 1)


def test_a_relist_is_diffed_against_what_was_known() -> None:
    cursor = Cursor()
    cursor.listed([obj("a", "1"), obj("b", "2"), obj("c", "3")], resource_version="5")
    cursor.observed("MODIFIED", obj("c", "6"))  # seen on the watch: known at version 6
    cursor.expire()
    assert cursor.must_list
    events = cursor.listed([obj("b", "7"), obj("c", "6"), obj("d", "8")], resource_version="9")
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [
        ("DELETED", "a"),  # vanished while the watch was down
        ("MODIFIED", "b"),
        ("ADDED", "d"),  # c is unchanged since the watch saw it: not delivered again
    ]
    assert events[0].object == identity(obj("a", "1"))  # what `remember` kept of it
    assert set(cursor.known) == {"u-b", "u-c", "u-d"}
    assert cursor.expired == 1


def test_a_recreated_object_is_a_deletion_and_an_addition() -> None:
    cursor = Cursor()
    cursor.listed([obj("a", "1")], resource_version="1")
    again = obj("a", "4")
    again["metadata"]["uid"] = "u-a-2"  # type: ignore[index]
    events = cursor.listed([again], resource_version="4")
    assert [e.type for e in events] == ["DELETED", "ADDED"]


def test_remember_decides_what_a_synthesized_deletion_carries() -> None:
    cursor = Cursor(remember=lambda o: {"metadata": o["metadata"], "spec": o["spec"]})
    cursor.listed([obj("a", "1", spec={"nodeName": "n1"}, status={"big": "x" * 100})], resource_version="1")
    (deleted,) = cursor.listed([], resource_version="2")
    assert deleted == Event("DELETED", {"metadata": obj("a", "1")["metadata"], "spec": {"nodeName": "n1"}})


def test_watch_events_and_bookmarks_move_the_version() -> None:
    cursor = Cursor()
    cursor.listed([], resource_version="5")
    assert cursor.observed("ADDED", obj("a", "6"))
    assert not cursor.observed("BOOKMARK", {"metadata": {"resourceVersion": "9"}})
    assert cursor.resource_version == "9"
    assert cursor.observed("DELETED", obj("a", "10"))
    assert cursor.known == {}
    assert cursor.resource_version == "10"


def test_a_list_without_a_version_is_listed_again() -> None:
    cursor = Cursor()
    cursor.listed([], resource_version="")
    assert cursor.must_list


def test_one_backoff_doubles_caps_and_resets() -> None:
    backoff = Backoff(BackoffPolicy(initial=0.5, maximum=4.0))
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    backoff.reset()
    assert backoff.next() == 0.5
    assert backoff.next(retry_after=3.0) == 3.0  # the server's word, when longer
    assert backoff.next(retry_after=60.0) == 4.0  # capped


def test_parse_line() -> None:
    assert parse_line(b"\n") is None
    assert parse_line(b'{"type": "ADDED", "object": {"a": 1}}\n') == ("ADDED", {"a": 1})
    with pytest.raises(errors.Gone):
        parse_line(b'{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}')
    with pytest.raises(errors.Unavailable):
        parse_line(b'{"type": "ERROR", "object": {"kind": "Status"}}')  # no code: a server fault
    with pytest.raises(errors.Unavailable, match="not JSON"):
        parse_line(b'{"type": "ADD')  # a truncated stream
    with pytest.raises(errors.Unavailable, match="not a watch event"):
        parse_line(b'{"object": {}}')


def test_a_list_that_failed_half_way_says_deleted_for_what_it_delivered_and_vanished() -> None:
    """Pages are delivered as they arrive: a list that fails after its first page has delivered
    objects; the list that follows must say DELETED for those that are gone by then."""
    cursor = Cursor()
    cursor.begin()
    assert [e.type for e in cursor.page([obj("a", "1"), obj("b", "1")])] == [None, None]
    cursor.begin()  # the first attempt failed (a 410 on its continue token): listed again
    events = cursor.page([obj("b", "1"), obj("c", "2")])
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [(None, "b"), (None, "c")]
    deleted = cursor.end(resource_version="3")
    assert [(e.type, e.object["metadata"]["name"]) for e in deleted] == [("DELETED", "a")]
    assert set(cursor.known) == {"u-b", "u-c"}
    assert not cursor.fresh
