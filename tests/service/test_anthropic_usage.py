"""An Anthropic stream's prompt, however its bytes are cut into chunks.

The prompt of a ``/v1/messages`` stream is said once, in its first event (``message_start``);
its last usage (``message_delta``) has the output only. A stream of 40 tokens is longer than the
tail the meter keeps, so when a busy gateway reads many events in one block, the start must be
read before that block's older part is dropped. Built here from the recording of the real
llama-server (tests/fixtures/streams/anthropic_messages.sse) with its text deltas repeated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocmforge_supervisor.service.core._usage import StreamMeter, Used

STREAMS = Path(__file__).parents[1] / "fixtures" / "streams"
TOKENS = 40


def _long_stream() -> tuple[bytes, Used]:
    """A recorded stream stretched to ``TOKENS`` text deltas, and what it used."""
    raw = (STREAMS / "anthropic_messages.sse").read_bytes()
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e.strip()]
    deltas = [e for e in events if b'"type":"content_block_delta"' in e]
    head = [e for e in events if e not in deltas and b"content_block_stop" not in e][:2]
    tail = events[events.index(deltas[-1]) + 1 :]
    body = [deltas[i % len(deltas)] for i in range(TOKENS)]
    tail = [e.replace(b'"output_tokens":5', f'"output_tokens":{TOKENS}'.encode()) for e in tail]
    stream = b"".join(head + body + tail)
    usage = json.loads(head[0].split(b"data: ", 1)[1])["message"]["usage"]
    cached = usage["cache_read_input_tokens"]
    return stream, Used(usage["input_tokens"] + cached, TOKENS, cached)


STREAM, USED = _long_stream()


def _metered(chunks: list[bytes]) -> Used:
    meter = StreamMeter("/v1/messages")
    for chunk in chunks:
        meter.feed(chunk)
    return meter.used()


def test_the_stream_is_longer_than_the_meters_tail() -> None:
    assert len(STREAM) > 4096 and STREAM.count(b"content_block_delta") == 2 * TOKENS


def test_a_long_stream_in_one_chunk_says_its_prompt() -> None:
    assert _metered([STREAM]) == USED


def test_a_long_stream_split_at_every_byte_says_its_prompt() -> None:
    wrong = {i: got for i in range(1, len(STREAM)) if (got := _metered([STREAM[:i], STREAM[i:]])) != USED}
    assert not wrong, f"{len(wrong)} of {len(STREAM) - 1} split points: first {next(iter(wrong.items()))}"


@pytest.mark.parametrize("size", [1, 7, 64, 1000])
def test_a_long_stream_in_small_pieces_says_its_prompt(size: int) -> None:
    pieces = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert _metered(pieces) == USED


def test_a_stream_cut_after_its_start_keeps_the_prompt_and_counts_the_tokens_so_far() -> None:
    cut = STREAM.index(b"event: content_block_delta") + 1
    for n in range(3):  # n events after the start, each block split after its first byte
        end = STREAM.index(b"event: content_block_delta", cut) if n else cut - 1
        got = _metered([STREAM[:1], STREAM[1:end]])
        assert got.prompt == USED.prompt and got.cached == USED.cached
        cut = end + 1


def test_a_start_without_usage_gives_no_prompt_and_does_not_take_the_last_usage() -> None:
    stream = STREAM.replace(b'"usage":{"cache_read_input_tokens"', b'"usage_":{"cache_read_input_tokens"', 1)
    got = _metered([stream])
    assert got.prompt is None and got.completion == TOKENS
