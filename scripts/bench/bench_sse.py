#!/usr/bin/env python3
"""Events/s of our SSE decoder against httpx-sse, on recorded llama-server streams.

    .venv/bin/python scripts/bench/bench_sse.py [--events 100000] [--runs 7]

Each recorded stream is repeated until it holds about ``--events`` events, cut into chunks (one
event per chunk, as llama-server writes them and a reader that keeps up receives them; 256 bytes,
cut anywhere; 16 KiB: a reader that falls behind) and decoded by:

* ``httpx-sse``: what ``EventSource.iter_sse`` does: httpx's incremental UTF-8 ``TextDecoder``
  (``iter_text``), httpx-sse's ``SSELineDecoder``, ``line.rstrip("\\n")``, httpx-sse's ``SSEDecoder``;
* ``httpx-lines``: httpx's ``iter_lines`` path (``TextDecoder`` + ``LineDecoder``) + httpx-sse's
  ``SSEDecoder``;
* ``ours``: ``rocmforge_supervisor.client._sse.SSEDecoder.feed`` on the bytes.

Then end to end with JSON (``+json``): httpx-sse plus ``json.loads`` per event, against our
``iter_chunks``, one event per chunk. The figure is the median of ``--runs`` runs; the
decoders take turns within each run so that load from elsewhere hits them alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from httpx._decoders import LineDecoder, TextDecoder  # noqa: E402
from httpx_sse._decoders import SSEDecoder as HxSSEDecoder  # noqa: E402
from httpx_sse._decoders import SSELineDecoder  # noqa: E402

from rocmforge_supervisor.client._sse import SSEDecoder, iter_chunks  # noqa: E402

STREAMS = ROOT / "tests" / "fixtures" / "streams"
NAMES = ["chat_include_usage.sse", "completions.sse", "tiny_completions.sse"]


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def httpx_sse(parts: list[bytes]) -> int:
    text, lines, sse, n = TextDecoder("utf-8"), SSELineDecoder(), HxSSEDecoder(), 0
    for part in parts:
        for line in lines.decode(text.decode(part)):
            if sse.decode(line.rstrip("\n")) is not None:
                n += 1
    for line in lines.decode(text.flush()) + lines.flush():
        if sse.decode(line.rstrip("\n")) is not None:
            n += 1
    return n


def httpx_lines(parts: list[bytes]) -> int:
    text, lines, sse, n = TextDecoder("utf-8"), LineDecoder(), HxSSEDecoder(), 0
    for part in parts:
        for line in lines.decode(text.decode(part)):
            if sse.decode(line) is not None:
                n += 1
    return n


def ours(parts: list[bytes]) -> int:
    dec, n = SSEDecoder(), 0
    for part in parts:
        n += len(dec.feed(part))
    dec.close()
    return n


def _hx_events(parts: list[bytes]) -> Iterator[str]:
    text, lines, sse = TextDecoder("utf-8"), SSELineDecoder(), HxSSEDecoder()
    for part in parts:
        for line in lines.decode(text.decode(part)):
            ev = sse.decode(line.rstrip("\n"))
            if ev is not None:
                yield ev.data


def httpx_sse_json(parts: list[bytes]) -> int:
    n = 0
    for data in _hx_events(parts):
        if data == "[DONE]":
            break
        obj = json.loads(data)
        if not isinstance(obj, dict) or obj.get("error") is not None:  # the checks iter_chunks makes
            raise ValueError(data)
        n += 1
    return n


def ours_json(parts: list[bytes]) -> int:
    return sum(1 for _ in iter_chunks(parts, require_done=False))


def bench(fns: list[Callable[[list[bytes]], int]], parts: list[bytes], runs: int) -> list[tuple[float, int]]:
    """Events/s of each function, median over runs; the functions take turns, so a busy machine
    slows them alike."""
    times: list[list[float]] = [[] for _ in fns]
    counts = [0] * len(fns)
    for _ in range(runs):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            counts[i] = fn(parts)
            times[i].append(time.perf_counter() - t0)
    return [(n / statistics.median(t), n) for t, n in zip(times, counts, strict=True)]


def split_events(data: bytes) -> list[bytes]:
    """One chunk per event, as llama-server writes them and a client that keeps up reads them."""
    return [e + b"\n\n" for e in data.split(b"\n\n") if e]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}; events/s, median of {args.runs} runs (higher is better)")
    print(
        f"{'stream':30} {'chunks':>6} {'httpx-sse':>11} {'httpx-lines':>11} {'ours':>11} {'ours/hx-sse':>11}"
    )
    for name in NAMES:
        raw = (STREAMS / name).read_bytes()
        data = raw * max(1, args.events // raw.count(b"\n\n"))
        for label, parts in (
            ("event", split_events(data)),
            ("256", chunks(data, 256)),
            ("16384", chunks(data, 16384)),
        ):
            (a, na), (a2, na2), (b, nb) = bench([httpx_sse, httpx_lines, ours], parts, args.runs)
            assert na == nb, (name, na, nb)
            print(f"{name:30} {label:>6} {a:>11,.0f} {a2:>11,.0f} {b:>11,.0f} {b / a:>10.2f}x")
            if na2 != nb:
                print(f"  note: httpx-lines saw {na2} events, ours {nb} (str.splitlines splits inside data)")
        # [DONE] ends iter_chunks, so the repeated stream is fed with its [DONE] events removed.
        parts = split_events(data.replace(b"data: [DONE]\n\n", b""))
        (a, na), (b, nb) = bench([httpx_sse_json, ours_json], parts, args.runs)
        assert na == nb, (name, na, nb)
        print(f"{name + ' +json':30} {'event':>6} {a:>11,.0f} {'':>11} {b:>11,.0f} {b / a:>10.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
