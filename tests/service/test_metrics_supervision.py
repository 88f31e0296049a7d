"""The supervision counters in /metrics, from the status rows the control API sends: restarts,
the watchdog's stalls and the unloads that yielded memory to other programs."""

from __future__ import annotations

from typing import Any

from rocmforge_supervisor.service._metrics import Metrics


def _row(**over: Any) -> dict[str, Any]:
    row = {"name": "m", "state": "stopped", "restarts": 1, "in_flight": 0, "waiting": 0, "pid": None}
    row.update(over)
    return row


def test_stalls_and_pressure_evictions_per_model() -> None:
    text = Metrics(lambda: [_row(stalls=2, pressure_evictions=3)]).render().decode()
    assert 'forge_model_stalls{model="m"} 2.0' in text
    assert 'forge_model_pressure_evictions{model="m"} 3.0' in text
    assert 'forge_model_restarts{model="m"} 1.0' in text


def test_rows_without_the_counters_read_zero() -> None:
    text = Metrics(lambda: [_row()]).render().decode()
    assert 'forge_model_pressure_evictions{model="m"} 0.0' in text
