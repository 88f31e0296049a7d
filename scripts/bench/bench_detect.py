"""Time hardware discovery on the 8 × MI300X fixture (no amdsmi, no NVML): detect() and refresh_usage().

The budget is 20 ms for detect() on this fixture. Prints median / p95 / max in ms.

Usage: .venv/bin/python scripts/bench/bench_detect.py [--runs 300] [--machine mi300x_8] [--check]
  --check  exit 1 when the median detect() exceeds the budget
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.hardware import detect, refresh_usage

ROOT = Path(__file__).resolve().parents[2]
BUDGET_MS = 20.0


def timings(fn: Callable[[], object], runs: int) -> list[float]:
    for _ in range(5):  # warm the page cache and the imports
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def report(label: str, ms: list[float]) -> float:
    ms = sorted(ms)
    median = statistics.median(ms)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    print(f"{label:<16} runs={len(ms):<5} median={median:7.3f} ms  p95={p95:7.3f} ms  max={ms[-1]:7.3f} ms")
    return median


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--machine", default="mi300x_8")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    machine = ROOT / "tests" / "fixtures" / "sysfs" / args.machine
    settings = ForgeSettings().model_copy(
        update={
            "sysfs_root": machine / "sys",
            "dev_root": machine / "dev",
            "use_amdsmi": False,
            "use_nvml": False,
            "inherited_rocr_visible_devices": None,
            "inherited_cuda_visible_devices": None,
        }
    )
    inventory = detect(settings)
    gpus = [d for d in inventory.devices if d.vendor == "amd"]
    print(f"machine {args.machine}: {len(gpus)} AMD GPU(s), {len(inventory.gpus)} usable")
    median = report("detect()", timings(lambda: detect(settings), args.runs))
    report("refresh_usage()", timings(lambda: refresh_usage(inventory, settings), args.runs))
    print(f"budget: detect() median ≤ {BUDGET_MS:.0f} ms → {'ok' if median <= BUDGET_MS else 'OVER'}")
    return 1 if args.check and median > BUDGET_MS else 0


if __name__ == "__main__":
    sys.exit(main())
