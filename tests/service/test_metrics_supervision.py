"""The supervision counters in /metrics, from the status rows the control API sends: restarts,
the watchdog's stalls and the unloads that yielded memory to other programs."""

from __future__ import annotations

from typing import Any

from rocmforge_supervisor.service.core._metrics import Metrics
from rocmforge_supervisor.supervisor import ModelState, ModelStatus


def _row(**over: Any) -> ModelStatus:
    return ModelStatus(name="m", state=ModelState.STOPPED, since=0.0, path="m.gguf", restarts=1, **over)


def test_stalls_and_pressure_evictions_per_model() -> None:
    text = Metrics(lambda: [_row(stalls=2, pressure_evictions=3)]).render().decode()
    assert 'forge_model_stalls{model="m"} 2.0' in text
    assert 'forge_model_pressure_evictions{model="m"} 3.0' in text
    assert 'forge_model_restarts{model="m"} 1.0' in text
    assert 'forge_model_state{model="m",state="stopped"} 1.0' in text
    assert 'forge_model_state{model="m",state="ready"} 0.0' in text


def test_rows_without_the_counters_read_zero() -> None:
    text = Metrics(lambda: [_row()]).render().decode()
    assert 'forge_model_pressure_evictions{model="m"} 0.0' in text
