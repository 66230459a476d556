"""When a supervised process is started again (core.restart): at once after a first death,
then with a doubling, capped delay; forgiven after staying up."""

from __future__ import annotations

from elastic_gpu.core.restart import (
    Action,
    Backoff,
    ProcessState,
    failed_start,
    hung,
    observe,
    probe_due,
)

B = Backoff(initial_s=1.0, max_s=8.0, stable_s=60.0)


def test_never_started_is_started() -> None:
    state, action = observe(ProcessState(), False, 0.0, B)
    assert action is Action.START and not state.up


def test_a_running_process_found_at_start_is_adopted() -> None:
    state, action = observe(ProcessState(), True, 0.0, B)
    assert action is Action.NOTHING and state.up and state.reason == ""


def test_delays_double_up_to_the_cap() -> None:
    assert [B.delay(n) for n in range(7)] == [0.0, 0.0, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_a_first_death_restarts_at_once_a_second_waits() -> None:
    up, _ = observe(ProcessState(), True, 0.0, B)
    down, action = observe(up, False, 10.0, B)
    assert action is Action.START and down.deaths == 1 and down.reason == "exited"
    up, _ = observe(down, True, 10.1, B)
    down, action = observe(up, False, 11.0, B)
    assert down.deaths == 2 and action is Action.WAIT  # 1 s after the death
    assert observe(down, False, 11.5, B)[1] is Action.WAIT
    assert observe(down, False, 12.0, B)[1] is Action.START


def test_failed_starts_back_off() -> None:
    state = ProcessState()
    now = 0.0
    waits = []
    for _ in range(5):
        state = failed_start(state, now, "no driver")
        start = now
        while observe(state, False, now, B)[1] is not Action.START:
            now += 0.5
        waits.append(now - start)
    assert waits == [0.0, 1.0, 2.0, 4.0, 8.0]
    assert state.reason == "no driver" and not state.up


def test_staying_up_forgives_earlier_deaths() -> None:
    state = failed_start(failed_start(ProcessState(), 0.0, "x"), 1.0, "x")
    up, _ = observe(state, True, 2.0, B)
    assert up.deaths == 2
    still, _ = observe(up, True, 61.0, B)
    assert still.deaths, "not yet stable"
    forgiven, _ = observe(still, True, 62.0, B)
    assert forgiven.deaths == 0
    assert observe(forgiven, False, 70.0, B)[1] is Action.START


def test_a_hung_process_is_a_death_restarted_with_the_backoff() -> None:
    up, _ = observe(ProcessState(), True, 0.0, B)
    # It runs but failed its probe: killed, one death, restarted at once the first time ...
    down = hung(up, 5.0, "hung: no answer within 5 s")
    assert (down.up, down.deaths, down.reason) == (False, 1, "hung: no answer within 5 s")
    assert observe(down, False, 5.0, B)[1] is Action.START
    # ... and a restarted daemon that hangs again waits, as one that exits again would.
    again = hung(observe(down, True, 5.1, B)[0], 6.0, "hung")
    assert again.deaths == 2
    assert observe(again, False, 6.5, B)[1] is Action.WAIT
    assert observe(again, False, 7.0, B)[1] is Action.START


def test_probes_are_due_at_once_then_every_period_and_never_when_off() -> None:
    assert probe_due(None, 0.0, 10.0)
    assert not probe_due(3.0, 12.9, 10.0)
    assert probe_due(3.0, 13.0, 10.0)
    assert not probe_due(None, 100.0, 0.0)
