"""Reading what a child allocated from its log lines.

CPU lines are copied from the real llama-server (4df29be) on this machine; GPU lines have the
shape of the same format strings (``llama-model.cpp``: ``"%s: %12s model buffer size = %8.2f
MiB"``, ``llama-kv-cache.cpp``, ``llama-context.cpp``) with the buffer names the ROCm/CUDA
backends give (``ROCm0``, ``ROCm_Host``, ``CUDA0``, ``CUDA_Host``) — recorded-shape lines, as no
GPU is here.
"""

from __future__ import annotations

import pytest

from rocmforge_supervisor.models import AllocationLedger, parse_allocation_line
from rocmforge_supervisor.models._allocations import buffer_device

MIB = 1024 * 1024

REAL_CPU_LOG = """\
0.00.016.000 I cmn  common_init_: fitting params to device memory ...
0.00.558.572 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
0.00.558.598 I common_memory_breakdown_print: |   - Host               |                  408 =   222 +     133 +      52                |
0.01.086.320 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
0.01.101.543 I load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
0.01.101.566 I load_tensors:   CPU_REPACK model buffer size =    12.66 MiB
0.01.118.903 I llama_context:        CPU  output buffer size =     4.00 MiB
0.01.118.917 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 32768 cells
0.01.119.109 I llama_kv_cache:        CPU KV buffer size =    96.00 MiB
0.01.185.171 I llama_kv_cache: size =   96.00 MiB ( 32768 cells,   3 layers,  4/1 seqs), K (f16):   48.00 MiB, V (f16):   48.00 MiB
0.01.185.207 I llama_kv_cache_iswa: creating     SWA KV cache, size = 2560 cells
0.01.185.303 I llama_kv_cache:        CPU KV buffer size =    37.50 MiB
0.01.212.317 I sched_reserve:        CPU compute buffer size =    52.27 MiB
0.01.272.344 I slot   load_model: id  0 | task -1 | new slot, n_ctx = 32768
"""


def test_real_cpu_log() -> None:
    ledger = AllocationLedger().feed_all(REAL_CPU_LOG.splitlines())
    parts = ledger.by_device()["cpu"]
    assert parts["weights"] == round(235.16 * MIB) + round(12.66 * MIB)
    assert parts["kv"] == 96 * MIB + round(37.5 * MIB)
    assert parts["compute"] == round(52.27 * MIB)
    assert parts["output"] == 4 * MIB
    assert ledger.device_totals() == {"cpu": ledger.total_bytes}
    assert [a.buffer for a in ledger.allocations][:2] == ["CPU_Mapped", "CPU_REPACK"]
    assert ledger.to_json()["by_device"]["cpu"]["total_bytes"] == ledger.total_bytes  # type: ignore[index]


@pytest.mark.parametrize(
    "line",
    [
        "0.01.212.317 I llama_kv_cache: size =   96.00 MiB ( 32768 cells,   3 layers,  4/1 seqs), K (f16):   48.00 MiB",
        "0.00.558.598 I common_memory_breakdown_print: |   - Host               |  408 =   222 +     133 +      52 |",
        "D sched_reserve:        CPU compute buffer size is  52.2700 MiB, matches expectation of  52.2700 MiB",
        "srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200",
        "",
    ],
)
def test_other_lines_are_ignored(line: str) -> None:
    assert parse_allocation_line(line) is None


@pytest.mark.parametrize(
    ("line", "device", "buffer", "part", "mib"),
    [
        ("load_tensors:        ROCm0 model buffer size =  1918.35 MiB", "amd:0", "ROCm0", "weights", 1918.35),
        ("load_tensors:        ROCm1 model buffer size =   960.00 MiB", "amd:1", "ROCm1", "weights", 960.0),
        ("llama_kv_cache:      ROCm0 KV buffer size =  1024.00 MiB", "amd:0", "ROCm0", "kv", 1024.0),
        ("sched_reserve:      ROCm0 compute buffer size =   560.00 MiB", "amd:0", "ROCm0", "compute", 560.0),
        (
            "sched_reserve:  ROCm_Host compute buffer size =    24.01 MiB",
            "cpu",
            "ROCm_Host",
            "compute",
            24.01,
        ),
        ("llama_context:  ROCm_Host  output buffer size =     0.49 MiB", "cpu", "ROCm_Host", "output", 0.49),
        (
            "load_tensors:        CUDA0 model buffer size =  4403.49 MiB",
            "nvidia:0",
            "CUDA0",
            "weights",
            4403.49,
        ),
        (
            "sched_reserve:  CUDA_Host compute buffer size =    16.01 MiB",
            "cpu",
            "CUDA_Host",
            "compute",
            16.01,
        ),
        (
            "load_tensors:      Vulkan0 model buffer size =   100.00 MiB",
            "vulkan:0",
            "Vulkan0",
            "weights",
            100.0,
        ),
        ("llama_memory_recurrent:        CPU RS buffer size =     0.50 MiB", "cpu", "CPU", "kv", 0.5),
        # --no-log-prefix --no-log-timestamps (as Ollama runs it): the same text, bare
        (
            "load_tensors:   CPU_Mapped model buffer size =   235.16 MiB",
            "cpu",
            "CPU_Mapped",
            "weights",
            235.16,
        ),
    ],
)
def test_gpu_and_host_lines(line: str, device: str, buffer: str, part: str, mib: float) -> None:
    for text in (line, f"0.01.101.543 I {line}", f"{line}\n"):
        a = parse_allocation_line(text)
        assert a is not None, text
        assert (a.device, a.buffer, a.part, a.bytes) == (device, buffer, part, round(mib * MIB))


def test_mask_translation() -> None:
    """A child started under HIP_VISIBLE_DEVICES=2,5 calls those GPUs ROCm0 and ROCm1."""
    keys = ["amd:2", "amd:5"]
    assert buffer_device("ROCm0", keys) == "amd:2"
    assert buffer_device("ROCm1", keys) == "amd:5"
    assert buffer_device("ROCm_Host", keys) == "cpu"
    assert buffer_device("CPU_Mapped", keys) == "cpu"
    ledger = AllocationLedger(gpu_keys=keys)
    ledger.feed("load_tensors:        ROCm1 model buffer size =  100.00 MiB")
    ledger.feed("load_tensors:   CPU_Mapped model buffer size =   10.00 MiB")
    assert ledger.device_totals() == {"amd:5": 100 * MIB, "cpu": 10 * MIB}


def test_a_second_load_replaces_the_first() -> None:
    """A dry run printed at debug level, then the real load: only the real figures count."""
    dry = [
        "load_tensors:        ROCm0 model buffer size =  1000.00 MiB",
        "llama_kv_cache:      ROCm0 KV buffer size =   512.00 MiB",
        "sched_reserve:      ROCm0 compute buffer size =   300.00 MiB",
    ]
    real = [
        "load_tensors:        ROCm0 model buffer size =  1000.00 MiB",
        "load_tensors:   CPU_Mapped model buffer size =   200.00 MiB",
        "llama_kv_cache:      ROCm0 KV buffer size =   256.00 MiB",
        "llama_kv_cache:      ROCm0 KV buffer size =    64.00 MiB",
        "sched_reserve:      ROCm0 compute buffer size =   300.00 MiB",
    ]
    ledger = AllocationLedger().feed_all(dry + real)
    assert ledger.by_device() == {
        "amd:0": {"weights": 1000 * MIB, "kv": 320 * MIB, "compute": 300 * MIB},
        "cpu": {"weights": 200 * MIB},
    }
    assert ledger.part_totals()["kv"] == 320 * MIB
    assert bool(ledger) and not bool(AllocationLedger())
