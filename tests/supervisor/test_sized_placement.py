"""A model of a given size (a command's ``memory``, a whisper model's file plus state) through the
one :func:`place` (pure): the devices its ``gpu`` names, idle models evicted for room, the rules'
conflicts, and a refusal that says what it needs. The supervisor-level matrix over every backend is
test_residency_matrix.py; these are the decisions themselves, on hand-made machines.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rocmforge_supervisor._errors import PlacementError, ResidencyConflict
from rocmforge_supervisor.config import GpuChoice, ModelConfig
from rocmforge_supervisor.hardware._types import Inventory
from rocmforge_supervisor.models._gguf import GGUFInfo
from rocmforge_supervisor.supervisor.backends.command import command_request
from rocmforge_supervisor.supervisor.backends.whisper import whisper_request
from rocmforge_supervisor.supervisor.placement._placement import LoadedModel, PlacementPolicy, place
from rocmforge_supervisor.supervisor.placement._residency import GroupRule, Residency
from tests.models.conftest import GIB
from tests.supervisor.test_placement import KFD, amd, cpu, loaded, no_gpu, one_7900xtx


def _command(name: str, memory: str | None, **keys: Any) -> ModelConfig:
    """A command's ``[models.NAME]`` as the config reader validates it."""
    table = {"path": name, "backend": "command", "cmd": ["srv", "--port", "${PORT}"], **keys}
    return ModelConfig.model_validate(table if memory is None else {**table, "memory": memory})


def _on_cpu(name: str, gib: float, *, pinned: bool = False, never_swap: bool = False) -> LoadedModel:
    return replace(loaded(name, gib, "cpu"), residency=Residency(pinned=pinned, never_swap=never_swap))


def test_three_commands_of_forty_percent_of_ram_swap_the_idle_one() -> None:
    ram = no_gpu(ram_gib=24)  # 22 GiB free; each command takes 9.6 GiB
    a, b = _on_cpu("a", 9.6), replace(_on_cpu("b", 9.6), last_used=5.0)
    d = place(ram, command_request("c", _command("c", "9.6GiB")), [a, b], PlacementPolicy(now=10.0))
    assert d.devices == ("cpu",) and d.evict == ["a"]
    assert d.evict_rules["a"].startswith("memory") and "its memory, as configured" in d.reason


@pytest.mark.parametrize(
    ("keys", "rule"), [({"pinned": True}, "pinned"), ({"never_swap": True}, 'swap = "never"')]
)
def test_kept_models_holding_the_memory_are_a_conflict_not_a_placement_error(
    keys: dict[str, bool], rule: str
) -> None:
    ram = no_gpu(ram_gib=24)
    held = [_on_cpu("a", 9.6, **keys), _on_cpu("b", 9.6, **keys)]
    with pytest.raises(ResidencyConflict) as err:
        place(ram, command_request("c", _command("c", "9.6GiB")), held)
    assert err.value.rule == rule and "more on cpu" in err.value.message


def test_a_group_rule_applies_to_a_command_as_to_any_model() -> None:
    groups = {"g": GroupRule("g", frozenset({"a", "c"}), max_loaded=1)}
    d = place(
        one_7900xtx(),
        command_request("c", _command("c", "1GiB")),
        [loaded("a", 1)],
        PlacementPolicy(groups=groups),
    )
    assert d.evict == ["a"] and d.evict_rules["a"] == "group 'g' has max_loaded = 1"


def test_a_command_that_never_fits_names_its_memory_and_what_holds_the_rest() -> None:
    busy = loaded("busy", 4, in_flight=1)
    with pytest.raises(PlacementError) as err:
        place(one_7900xtx(), command_request("c", _command("c", "30GiB", gpu=0)), [busy])
    assert not isinstance(err.value, ResidencyConflict)
    message = err.value.message
    assert message.startswith("c (command model) does not fit: it needs 30.0 GiB per device")
    assert "of 24.0 GiB" in message and "busy, not evicted: busy" in message
    assert "lower the model's memory" in str(err.value) and "forge unload" in str(err.value)


def test_a_command_goes_on_every_gpu_of_its_list_and_a_whisper_model_on_the_first() -> None:
    two = Inventory((amd(0, "RX 7900 XTX", 24), amd(1, "RX 7900 XTX", 24), cpu()), KFD)
    d = place(two, command_request("c", _command("c", "8GiB", gpu=[0, 1])), [])
    assert d.devices == ("amd:0", "amd:1") and d.need_bytes == {"amd:0": 8 * GIB, "amd:1": 8 * GIB}
    info = GGUFInfo.outside(
        Path("ggml-stt.bin"), architecture="whisper", name="stt", file_type="F16", size_bytes=GIB
    )
    both: GpuChoice = [0, 1]
    w = place(two, whisper_request("stt", info, both, gpu_capable=True), [])
    assert w.devices == ("amd:0",)


def test_a_command_without_memory_is_placed_without_a_check() -> None:
    full = Inventory((amd(0, "RX 7900 XTX", 24, 23.9), cpu(4, 3.99)), KFD)
    d = place(full, command_request("c", _command("c", None)), [loaded("idle", 20)])
    assert d.devices == ("amd:0",) and d.evict == [] and "memory not configured" in d.reason
