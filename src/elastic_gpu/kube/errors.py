"""The API server's errors as a class hierarchy, chosen from the status code and the Status body.

    try:
        await client.create(path, obj)
    except AlreadyExists:
        ...

Every class is an `ApiStatusError` (kube.transport), so code that catches that keeps working.
"""

from __future__ import annotations

from typing import Any

import msgspec

from elastic_gpu.kube.transport import ApiStatusError


class ApiError(ApiStatusError):
    """An error answer of the API server (code, Status reason, message)."""

    #: whether retrying the same request later may succeed
    retryable = False


class BadRequest(ApiError):
    """400."""


class Unauthorized(ApiError):
    """401: no or bad credentials."""


class Forbidden(ApiError):
    """403: RBAC refuses (also a namespace being terminated refusing creates)."""


class NotFound(ApiError):
    """404."""


class MethodNotAllowed(ApiError):
    """405."""


class Conflict(ApiError):
    """409 other than AlreadyExists: a resourceVersion precondition failed (re-read, retry)."""

    retryable = True


class AlreadyExists(Conflict):
    """409 reason AlreadyExists: a create met an object of that name."""

    retryable = False


class Gone(ApiError):
    """410: a watch or list from a resourceVersion too old (relist)."""

    retryable = True


class Invalid(ApiError):
    """422: the object breaks the schema or a validation rule; the message names the field."""


class TooManyRequests(ApiError):
    """429: the API server's priority-and-fairness or a webhook said slow down."""

    retryable = True


class ServerError(ApiError):
    """5xx (including 504 Timeout from the server itself)."""

    retryable = True


class Unreachable(ApiError):
    """No answer at all: connection refused or reset, DNS, or our own timeout (code 0). The
    request may or may not have been applied."""

    retryable = True


_BY_CODE: dict[int, type[ApiError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 405: MethodNotAllowed,
    409: Conflict, 410: Gone, 422: Invalid, 429: TooManyRequests,
}


class _Status(msgspec.Struct):
    reason: str = ""
    message: str = ""
    code: int = 0


def error_class(code: int, reason: str = "") -> type[ApiError]:
    if code == 0:
        return Unreachable
    if code == 409 and reason == "AlreadyExists":
        return AlreadyExists
    if code >= 500:
        return ServerError
    return _BY_CODE.get(code, ApiError)


def from_status(code: int, reason: str, message: str) -> ApiError:
    """The error for a status code and a Status's reason and message."""
    return error_class(code, reason)(code, reason, message)


def from_response(code: int, body: bytes) -> ApiError:
    """The error for an HTTP status and its body (a `metav1.Status`, or anything else)."""
    try:
        status = msgspec.json.decode(body, type=_Status)
    except msgspec.DecodeError:
        return from_status(code, "", body[:200].decode(errors="replace"))
    return from_status(code, status.reason, status.message)


def from_status_object(obj: dict[str, Any]) -> ApiError:
    """The error of a watch ERROR event's object (a Status)."""
    code = obj.get("code")
    return from_status(code if isinstance(code, int) else 500, str(obj.get("reason") or ""),
                       str(obj.get("message") or ""))


def translate(err: ApiStatusError) -> ApiError:
    """A plain ApiStatusError (from kube.transport) as the class of its code."""
    if isinstance(err, ApiError):
        return err
    return from_status(err.code, err.reason, err.message)
