"""An event's note fits the apiserver's limit in bytes, so a long non-ASCII reason is not lost.

events.k8s.io/v1 refuses a note over 1024 bytes with 422 (the limit is on the UTF-8 encoding,
Go's `len` of a string). Cutting at 1024 characters lets a reason in Japanese, or one quoting a
pod's non-ASCII labels, through at up to 4 KiB: the event is refused and the user never sees why
the pod is pending (issue 20, item 11).
"""

from __future__ import annotations

from kubernetes_asyncio import client

from bindery.adapters.events import NOTE_LIMIT, KubeEventSink, fit_note
from bindery.scheduling.podspec import PodInfo
from tests.operator.conftest import create_pod, events_of, pod_body


async def test_a_long_non_ascii_reason_is_written_cut_at_a_character_boundary_within_the_byte_limit(
    *, kube_api: client.ApiClient, namespace: str
) -> None:
    created = await create_pod(kube_api, namespace=namespace, body=pod_body(name="p", scheduler_name="s"))
    pod = PodInfo(uid=created["metadata"]["uid"], namespace=namespace, name="p", scheduler_name="s")
    # 600 characters, 1,200 bytes in UTF-8 (and a 3-byte character where a 2-byte cut would land).
    message = "ノード" + "é" * 597
    await KubeEventSink(api=kube_api).failed_scheduling(pod=pod, message=message, scheduler_name="s")

    (event,) = await events_of(kube_api, namespace=namespace, pod_name="p")
    note: str = event["note"]
    assert len(note.encode()) <= NOTE_LIMIT
    assert message.startswith(note)
    assert len(note.encode()) > NOTE_LIMIT - 4, "cut more than the last partial character"


def test_a_note_is_cut_by_utf8_bytes_never_inside_a_character() -> None:
    assert fit_note("short") == "short"
    assert fit_note("a" * 2000) == "a" * NOTE_LIMIT
    cut = fit_note("éa" * 1000)  # 3 bytes per pair: the 1,024th byte is the first of an "é"
    assert len(cut.encode()) <= NOTE_LIMIT
    assert ("éa" * 1000).startswith(cut)
    assert len(cut.encode()) == NOTE_LIMIT - 1
