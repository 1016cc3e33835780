"""The test servers' ports: drawn below the kernel's ephemeral range, so a client connection
cannot take one between its draw and its server's bind; a start that lost its port anyway is
retried with fresh ports, and no other failure is."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from free_ports import LOW, ephemeral_start, free_port
from shared_service import start_with_retries


def test_a_server_port_is_never_one_a_client_connection_could_be_given() -> None:
    start = ephemeral_start()
    ports = {free_port() for _ in range(50)}
    assert all(LOW <= p < start for p in ports), sorted(ports)
    assert len(ports) > 40  # drawn at random, not the same few


def test_a_drawn_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_start_that_lost_its_port_is_retried(tmp_path: Path) -> None:
    calls: list[int] = []

    def start(data: Path) -> tuple[object, dict[str, int]]:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("weed mini exited with 255: listen tcp 127.0.0.1:21000: bind: address already in use")
        return object(), {"attempts": len(calls)}

    _, info = start_with_retries(start)(tmp_path)  # type: ignore[arg-type]
    assert info == {"attempts": 3}


@pytest.mark.parametrize("message", ["not ready within 90 s", "weed mini exited with 1: bad flag"])
def test_any_other_start_failure_is_raised_at_once(tmp_path: Path, message: str) -> None:
    calls: list[int] = []

    def start(data: Path) -> tuple[object, dict[str, int]]:
        calls.append(1)
        raise RuntimeError(message)

    with pytest.raises(RuntimeError, match=message.split()[0]):
        start_with_retries(start)(tmp_path)  # type: ignore[arg-type]
    assert calls == [1]


def test_a_port_that_stays_taken_fails_after_the_last_attempt(tmp_path: Path) -> None:
    calls: list[int] = []

    def start(data: Path) -> tuple[object, dict[str, int]]:
        calls.append(1)
        raise RuntimeError("Address already in use")

    with pytest.raises(RuntimeError, match="already in use"):
        start_with_retries(start, attempts=2)(tmp_path)  # type: ignore[arg-type]
    assert calls == [1, 1]
