"""Loopback port selection: ports drawn below the kernel's ephemeral range (where outgoing
connections cannot take them between the draw and the component's bind), distinct, free, and
independent of the `random` module's seed (which a test runner sets alike in every worker)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from elastic_gpu.devcluster import ports
from elastic_gpu.devcluster.ports import HOST, LOWEST, drawable_range, free_ports

REAL_RANGE = ports.EPHEMERAL_RANGE


def ephemeral_low() -> int:
    return int(REAL_RANGE.read_text().split()[0])


@pytest.mark.skipif(not REAL_RANGE.exists() or ephemeral_low() - LOWEST < 1000,
                    reason="this kernel's ephemeral range leaves no room below it to draw from")
def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    drawn = free_ports(20)
    assert len(set(drawn)) == 20
    assert all(LOWEST <= port < ephemeral_low() for port in drawn)
    for port in drawn:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, port))  # free once the call returns


def test_the_draw_ignores_the_random_modules_seed() -> None:
    random.seed(7)
    first = free_ports(4)
    random.seed(7)
    assert free_ports(4) != first


def test_a_taken_port_is_never_returned(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    # a range file that makes the drawable range valid whatever the machine's is
    where = tmp_path / "range"
    where.write_text("40000 60999\n")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((HOST, 0))
        busy = int(taken.getsockname()[1])
        picks = iter([busy, busy, 23456])
        monkeypatch.setattr(ports._DRAW, "choice", lambda candidates: next(picks))
        assert free_ports(1, ephemeral_range=where) == [23456]


@pytest.mark.parametrize("text", ["", "not a number", "20500 60999"])
def test_an_unknown_or_too_small_range_leaves_the_choice_to_the_kernel(
        text: str, tmp_path: Path) -> None:
    where = tmp_path / "range"
    where.write_text(text)
    assert drawable_range(where) is None
    (port,) = free_ports(1, ephemeral_range=where)
    assert 0 < port < 65536
    assert drawable_range(tmp_path / "missing") is None


def test_the_range_runs_from_lowest_to_below_the_ephemeral_start(tmp_path: Path) -> None:
    where = tmp_path / "range"
    where.write_text("32768\t60999\n")
    assert drawable_range(where) == range(LOWEST, 32768)

