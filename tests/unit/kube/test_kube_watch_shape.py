"""A watch decodes each event's object into a shape when given one, as a list page does: only
the shape's fields are built; an ERROR event is still raised with its Status; and the
reflector asks its client for the shape it lists with."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec
import pytest

from elastic_gpu.kube.informer import Reflector
from elastic_gpu.kube.transport import ApiStatusError, ListPage, WatchDecoder


class _Meta(msgspec.Struct, omit_defaults=True):
    name: Any = msgspec.UNSET
    resourceVersion: Any = msgspec.UNSET


class _Named(msgspec.Struct, omit_defaults=True):
    metadata: _Meta | msgspec.UnsetType = msgspec.UNSET


class _Phase(msgspec.Struct, omit_defaults=True):
    phase: Any = msgspec.UNSET


class _WithStatus(msgspec.Struct, omit_defaults=True):
    """A shape a Status does not fit: its `status` is an object here, a string there."""

    metadata: _Meta | msgspec.UnsetType = msgspec.UNSET
    status: _Phase | msgspec.UnsetType = msgspec.UNSET


def line(kind: str, obj: dict[str, Any]) -> bytes:
    return msgspec.json.encode({"type": kind, "object": obj})


FULL = {"metadata": {"name": "n1", "resourceVersion": "7", "managedFields": [{"f": 1}]},
        "status": {"images": [{"names": ["a"]}]}}


def test_a_shaped_event_holds_only_the_shapes_fields() -> None:
    kind, obj = WatchDecoder(_Named)(line("MODIFIED", FULL))
    assert (kind, obj) == ("MODIFIED", {"metadata": {"name": "n1", "resourceVersion": "7"}})
    assert WatchDecoder()(line("MODIFIED", FULL)) == ("MODIFIED", FULL)  # no shape: whole


def test_a_bookmark_keeps_its_version_through_a_shape() -> None:
    bookmark = {"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": "99"}}
    assert WatchDecoder(_Named)(line("BOOKMARK", bookmark)) == (
        "BOOKMARK", {"metadata": {"resourceVersion": "99"}})


@pytest.mark.parametrize("shape", [None, _Named, _WithStatus])
def test_an_error_event_is_raised_with_its_status_whatever_the_shape(shape: Any) -> None:
    # a Status's `status` is a string ("Failure"): it fits no object's shape
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": "too old resource version: 1 (5)", "reason": "Expired", "code": 410}
    with pytest.raises(ApiStatusError) as err:
        WatchDecoder(shape)(line("ERROR", status))
    assert (err.value.code, err.value.reason) == (410, "Expired")
    assert "too old resource version" in str(err.value)


def test_an_object_that_fits_no_shape_is_a_decoding_error_not_an_event() -> None:
    with pytest.raises(msgspec.ValidationError):
        WatchDecoder(_WithStatus)(line("MODIFIED", {"status": "odd"}))


class _ShapedClient:
    """Lists one empty page, then records the shape each watch is asked for."""

    def __init__(self) -> None:
        self.shapes: list[Any] = []
        self.watching = asyncio.Event()

    async def list(self, path: str, params: Mapping[str, str] | None = None
                   ) -> tuple[list[dict[str, Any]], str]:
        raise AssertionError("a paged reflector lists page by page")

    async def list_pages(self, path: str, params: Mapping[str, str] | None = None, *,
                         shape: type[msgspec.Struct] | None = None) -> AsyncIterator[ListPage]:
        yield ListPage([], "1", last=True)

    async def watch(self, path: str, resource_version: str,
                    params: Mapping[str, str] | None = None, timeout_s: int = 300, *,
                    shape: type[msgspec.Struct] | None = None
                    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.shapes.append(shape)
        self.watching.set()
        await asyncio.Event().wait()
        yield "ADDED", {}


async def test_the_reflector_watches_with_the_shape_it_lists_with() -> None:
    client = _ShapedClient()
    reflector = Reflector(client, "/api/v1/nodes", name="nodes", shape=_Named,
                          on_page=lambda items, first, last: None,
                          on_event=lambda kind, obj: None)
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(client.watching.wait(), 10)
    finally:
        task.cancel()
    assert client.shapes == [_Named]
