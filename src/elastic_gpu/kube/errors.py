"""The API server's errors as a class hierarchy, chosen from the status code and the Status body.

    try:
        await client.create(path, obj)
    except AlreadyExists:
        ...

Every class is an `ApiStatusError` (kube.transport), so code that catches that keeps working.
"""

from __future__ import annotations

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


def error_class(code: int, reason: str = "") -> type[ApiError]:
    if code == 0:
        return Unreachable
    if code == 409 and reason == "AlreadyExists":
        return AlreadyExists
    if code >= 500:
        return ServerError
    return _BY_CODE.get(code, ApiError)


def translate(err: ApiStatusError) -> ApiError:
    """A plain ApiStatusError (from kube.transport, which reads the code and the Status body of
    responses and watch ERROR events) as the class of its code."""
    if isinstance(err, ApiError):
        return err
    return error_class(err.code, err.reason)(err.code, err.reason, err.message)
