"""``forge ps`` says what waits for each model per priority class and key (issue 36)."""

from __future__ import annotations

from rocmforge_supervisor.cli._serve import queue_line


def test_a_model_with_waiters_gets_its_queue_line() -> None:
    row = {
        "name": "m",
        "queue": {
            "waiting": {"interactive": 1, "batch": 3, "background": 0},
            "waiting_by_key": {"night": 3, "chat": 1},
        },
    }
    assert queue_line(row) == "m: queued 1 interactive, 3 batch, 0 background (keys: chat 1, night 3)"


def test_an_idle_model_or_an_older_service_gets_none() -> None:
    assert queue_line({"name": "m", "queue": {"waiting": {"interactive": 0, "batch": 0}}}) is None
    assert queue_line({"name": "m"}) is None
