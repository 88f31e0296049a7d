"""Where a whisper model goes (pure): one device, its file plus whisper.cpp's state; a CPU-only
whisper-server build stays on the CPU whatever ``gpu`` says."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from rocmforge_supervisor._errors import PlacementError
from rocmforge_supervisor.config import GpuChoice
from rocmforge_supervisor.hardware._types import Inventory
from rocmforge_supervisor.models import inspect_whisper, whisper_state_bytes
from rocmforge_supervisor.models._gguf import GGUFInfo
from rocmforge_supervisor.supervisor.backends.whisper import whisper_request
from rocmforge_supervisor.supervisor.placement._placement import LoadedModel, PlacementDecision, place
from tests.models.conftest import GIB
from tests.supervisor.test_placement import KFD, amd, cpu, one_7900xtx


def _whisper_file(path: Path, size: int = 150_000_000) -> GGUFInfo:
    """A whisper.cpp header (base: 6 audio layers, 512 wide, 80 mel bins, f16) padded to ``size``
    bytes: the magic and the 11 hparams whisper_model_load reads, n_mels before ftype."""
    header = struct.pack("<I11i", 0x67676D6C, 51864, 1500, 512, 8, 6, 448, 512, 8, 6, 80, 1)
    with path.open("wb") as f:
        f.write(header)
        f.truncate(size)
    return inspect_whisper(path)


def decide_whisper(
    name: str,
    info: GGUFInfo,
    gpu: GpuChoice,
    inventory: Inventory,
    loaded: list[LoadedModel],
    *,
    gpu_capable: bool,
) -> PlacementDecision:
    """The one placement every backend goes through, with a whisper model's request."""
    return place(inventory, whisper_request(name, info, gpu, gpu_capable=gpu_capable), loaded)


def test_the_header_describes_the_model(tmp_path: Path) -> None:
    info = _whisper_file(tmp_path / "ggml-base.en.bin")
    assert (info.architecture, info.size_label, info.file_type, info.vocab_size) == (
        "whisper",
        "base",
        "F16",
        51864,
    )
    assert info.file_size_bytes == 150_000_000


def test_a_gpu_build_goes_to_the_gpu_and_counts_file_plus_state(tmp_path: Path) -> None:
    info = _whisper_file(tmp_path / "m.bin")
    d = decide_whisper("stt", info, "auto", one_7900xtx(), [], gpu_capable=True)
    assert d.devices == ("amd:0",) and not d.on_cpu
    assert d.estimated_bytes == {"amd:0": info.file_size_bytes + whisper_state_bytes(info.file_size_bytes)}


def test_a_cpu_build_or_gpu_cpu_stays_on_the_cpu(tmp_path: Path) -> None:
    info = _whisper_file(tmp_path / "m.bin")
    assert decide_whisper("stt", info, "auto", one_7900xtx(), [], gpu_capable=False).devices == ("cpu",)
    assert decide_whisper("stt", info, "cpu", one_7900xtx(), [], gpu_capable=True).devices == ("cpu",)


def test_a_full_gpu_sends_it_to_the_cpu_and_nothing_free_is_refused(tmp_path: Path) -> None:
    info = _whisper_file(tmp_path / "m.bin")
    big = LoadedModel("llm", {"amd:0": int(23.4 * GIB)}, ("amd:0",), counted=False)
    # Where another device holds it, nothing is evicted for it: the idle model stays.
    d = decide_whisper("stt", info, "auto", one_7900xtx(), [big], gpu_capable=True)
    assert d.devices == ("cpu",) and d.evict == []
    tiny_ram = Inventory((amd(0, "RX 7900 XTX", 24, 23.9), cpu(total_gib=4, used_gib=3.99)), KFD)
    with pytest.raises(PlacementError) as err:
        decide_whisper("stt", info, "auto", tiny_ram, [], gpu_capable=True)
    assert "stt (whisper model) does not fit" in err.value.message and "cpu" in err.value.message
    assert "smaller whisper model" in str(err.value)


def test_an_idle_model_is_evicted_when_no_device_holds_it(tmp_path: Path) -> None:
    info = _whisper_file(tmp_path / "m.bin")
    tiny_ram = Inventory((amd(0, "RX 7900 XTX", 24, 0.5), cpu(total_gib=4, used_gib=3.99)), KFD)
    big = LoadedModel("llm", {"amd:0": int(23.4 * GIB)}, ("amd:0",), counted=False)
    d = decide_whisper("stt", info, "auto", tiny_ram, [big], gpu_capable=True)
    assert d.devices == ("amd:0",) and d.evict == ["llm"]
