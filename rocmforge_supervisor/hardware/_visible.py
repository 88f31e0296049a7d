"""How an inherited ``ROCR_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES`` filters and orders GPUs.

Follows ROCr's ``RvdFilter``: comma-separated tokens, each a device index or a ``GPU-…`` UUID
prefix (case-insensitive, unique); the first invalid, out-of-range or repeated token ends the list;
the devices are surfaced in the order the tokens name them; a set-but-empty value hides every GPU.
CUDA's ``CUDA_VISIBLE_DEVICES`` has the same shape (indices in PCI order once
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, or ``GPU-…`` UUID prefixes).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["visible_order"]


def visible_order(spec: str | None, uuids: Sequence[str | None]) -> list[int] | None:
    """Positions (into ``uuids``, the runtime's device list) that stay visible, in surfaced order.

    None when ``spec`` is None (the variable is not set: nothing is filtered).
    """
    if spec is None:
        return None
    if not spec.strip():
        return []
    upper = [u.upper() if u else None for u in uuids]
    tokens = [t.strip().upper() for t in spec.split(",")]
    chosen: list[int] = []
    for token in tokens[: len(uuids)]:
        index = _resolve(token, upper)
        if index is None or index in chosen:
            break
        chosen.append(index)
    return chosen


def _resolve(token: str, uuids: Sequence[str | None]) -> int | None:
    if not token:
        return None
    if token.startswith("G"):
        if not 5 <= len(token) <= 40:
            return None
        matches = [i for i, u in enumerate(uuids) if u is not None and u.startswith(token)]
        return matches[0] if len(matches) == 1 else None
    try:
        index = int(token, 0)
    except ValueError:
        return None
    return index if 0 <= index < len(uuids) else None
