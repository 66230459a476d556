"""The API error hierarchy: each status code and Status reason maps to its class, the way the
client meets them (the transport reads the response, `errors.translate` picks the class)."""

from __future__ import annotations

import json

import pytest

from elastic_gpu.kube import errors
from elastic_gpu.kube.transport import ApiStatusError, status_error


def from_response(code: int, body: bytes) -> errors.ApiError:
    return errors.translate(status_error(code, body))


def status(code: int, reason: str, message: str = "m") -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "code": code, "reason": reason, "message": message}).encode()


@pytest.mark.parametrize(("code", "reason", "cls"), [
    (400, "BadRequest", errors.BadRequest),
    (401, "Unauthorized", errors.Unauthorized),
    (403, "Forbidden", errors.Forbidden),
    (404, "NotFound", errors.NotFound),
    (409, "AlreadyExists", errors.AlreadyExists),
    (409, "Conflict", errors.Conflict),
    (410, "Expired", errors.Gone),
    (422, "Invalid", errors.Invalid),
    (429, "TooManyRequests", errors.TooManyRequests),
    (500, "InternalError", errors.ServerError),
    (503, "ServiceUnavailable", errors.ServerError),
    (504, "Timeout", errors.ServerError),
    (418, "", errors.ApiError),
])
def test_response_maps_to_its_class(code: int, reason: str, cls: type[errors.ApiError]) -> None:
    err = from_response(code, status(code, reason, "the message"))
    assert type(err) is cls
    assert (err.code, err.reason, err.message) == (code, reason, "the message")
    assert isinstance(err, ApiStatusError)  # code catching the old class keeps working


def test_already_exists_is_a_conflict_but_not_retryable() -> None:
    err = from_response(409, status(409, "AlreadyExists"))
    assert isinstance(err, errors.Conflict) and not err.retryable
    assert from_response(409, status(409, "Conflict")).retryable


def test_non_status_body_keeps_its_text() -> None:
    err = from_response(502, b"<html>bad gateway</html>")
    assert type(err) is errors.ServerError and "bad gateway" in err.message


def test_transport_failure_is_unreachable_and_retryable() -> None:
    err = errors.translate(ApiStatusError(0, "", "ClientConnectorError: refused"))
    assert type(err) is errors.Unreachable and err.retryable and not err.definite


def test_watch_error_object() -> None:
    # the transport raises a watch's ERROR event with the code inside its Status object
    err = from_response(410, status(410, "Expired", "too old"))
    assert type(err) is errors.Gone and err.message == "too old"
