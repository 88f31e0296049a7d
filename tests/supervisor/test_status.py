"""The state table and the breaker, as plain values."""

from __future__ import annotations

import pytest

from rocmforge_supervisor.supervisor.model._status import (
    TRANSITIONS,
    Breaker,
    IllegalTransition,
    ModelState,
    ModelStatus,
    check_transition,
)
from rocmforge_supervisor.supervisor.placement._placement_types import WorkerShare

S = ModelState


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(ModelState)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (S.UNLOADED, S.READY),  # never ready without loading
        (S.UNLOADED, S.DRAINING),
        (S.FAILED, S.LOADING),  # a failed model is reset first
        (S.FAILED, S.STOPPED),  # the failure stays visible after the task ends
        (S.STOPPED, S.READY),
        (S.DRAINING, S.READY),  # a drain ends in a stop
        (S.DRAINING, S.LOADING),  # a stop requested is never restarted
        (S.READY, S.READY),
    ],
)
def test_illegal_transitions_raise(old: ModelState, new: ModelState) -> None:
    with pytest.raises(IllegalTransition, match=f"{old.value} → {new.value}"):
        check_transition(old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (S.UNLOADED, S.LOADING),
        (S.LOADING, S.READY),
        (S.LOADING, S.LOADING),  # the restart's backoff
        (S.READY, S.LOADING),  # a crash
        (S.READY, S.DRAINING),
        (S.DRAINING, S.STOPPED),
        (S.LOADING, S.FAILED),
        (S.FAILED, S.UNLOADED),
        (S.STOPPED, S.LOADING),
    ],
)
def test_the_lifecycle_moves_are_allowed(old: ModelState, new: ModelState) -> None:
    check_transition(old, new)


def test_breaker_counts_crashes_inside_its_window_only() -> None:
    now = [0.0]
    b = Breaker(3, 10.0, clock=lambda: now[0])
    assert not b.record()
    now[0] = 5.0
    assert not b.record()
    now[0] = 12.0  # the first crash is out of the window
    assert not b.record() and b.crashes == 2
    now[0] = 13.0
    assert b.record() and b.crashes == 3
    b.reset()
    assert b.crashes == 0 and not b.record()


def test_status_json_keeps_the_control_api_keys() -> None:
    s = ModelStatus(name="m", state=S.READY, since=1.0, path="/m.gguf", pid=7, estimated_bytes={"cpu": 1})
    assert s.to_json() == {
        "name": "m",
        "backend": "llama",  # issue 23: which server runs it (llama-server or whisper-server)
        "label": "",  # its backend's label, and the requests it answers (the status page's)
        "serves": [],
        "state": "ready",
        "since": 1.0,
        "pid": 7,
        "port": None,
        "devices": [],
        "workers": [],
        "restarts": 0,
        "stalls": 0,
        "pressure_evictions": 0,
        "sleeping": False,
        "last_error": None,
        "last_crash": None,
        "uptime": None,
        "in_flight": 0,
        "waiting": 0,
        "load_seconds": None,
        "path": "/m.gguf",
        "memory": {"estimated_bytes": {"cpu": 1}, "actual_bytes": {}},
        "log_path": None,
        "modalities": [],
        "failure_kind": None,
        "last_stderr": [],
        "log_last": [],
        "ttl": None,
        "ttl_left": None,
        "max_concurrency": 0,
        "queue_limit": 0,
        "requests_total": 0,
        "keep_context": False,
        "contexts": {},
        "context": {},  # issue 37: ctx_size, parallel, kv_unified and per_request (forge ps)
        "residency": {},  # issue 33: pinned, swap, evict_cost, group, default
        "queue": {},  # issue 36: waiting and in flight per priority class, waiting per key
        "variants": [],  # issue 34: the names X:Y its variants and adapters are served under
        "adapters": [],
    }


def test_status_json_names_each_rpc_worker_share() -> None:
    share = WorkerShare(worker="10.0.0.2:50052", device=0, share=0.25, layers=5, estimated_bytes=1 << 20)
    s = ModelStatus(name="m", state=S.READY, since=1.0, path="/m.gguf", workers=[share])
    assert s.to_json()["workers"] == [
        {"worker": "10.0.0.2:50052", "device": 0, "share": 0.25, "layers": 5, "estimated_bytes": 1 << 20}
    ]
