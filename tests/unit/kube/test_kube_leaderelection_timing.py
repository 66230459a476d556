"""When a leader-election candidate tries again (`kube.leaderelection.next_attempt_s`)."""

from __future__ import annotations

import pytest

from elastic_gpu.kube.leaderelection import EXPIRY_MARGIN_S, next_attempt_s


def test_a_lease_expiring_within_the_retry_period_is_tried_just_after_it_expires() -> None:
    # the dead leader's Lease expires in 0.2 s: tried then, not 0.55 s from now
    assert next_attempt_s(0.55, 0.2) == pytest.approx(0.2 + EXPIRY_MARGIN_S)


@pytest.mark.parametrize("expires_in", [None, 0.55, 3.0, 0.0, -1.0])
def test_otherwise_the_retry_period(expires_in: float | None) -> None:
    # not held by another, fresh, or already expired (the attempt failed all the same: a
    # racing candidate won, the API refused): no busy loop
    assert next_attempt_s(0.55, expires_in) == 0.55
