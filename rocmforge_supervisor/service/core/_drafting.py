"""Speculative decoding's acceptance rate, per model, from the answers themselves.

llama-server puts ``draft_n`` (tokens the draft proposed) and ``draft_n_accepted`` (those the model
kept) in an answer's ``timings`` when it drafted (``server-common.cpp``, only when ``draft_n > 0``):
in a whole answer's body and in a stream's last event, which the relay's meter keeps in its tail.
Each answer adds them to ``forge_draft_tokens_total`` / ``forge_draft_accepted_total``; the status
page shows accepted / drafted.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

from ._usage import _int, _last_object

__all__ = ["DRAFT_MARK", "DraftTally", "drafted"]

#: In every answer that drafted (the key of ``draft_n``): an answer without it is not read.
DRAFT_MARK = b'"draft_n"'


def drafted(body: bytes) -> tuple[int, int] | None:
    """(drafted, accepted) of an answer (a whole body or a stream's tail); None: it did not draft."""
    timings = _last_object(body, b"timings")
    if timings is None:
        return None
    n, accepted = _int(timings.get("draft_n")), _int(timings.get("draft_n_accepted"))
    if not n:
        return None
    return n, accepted or 0


class DraftTally:
    """The two counters, and their totals per model for the status page."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.tokens = Counter(
            "forge_draft_tokens",
            "tokens a draft model proposed (speculative decoding)",
            ["model"],
            registry=registry,
        )
        self.accepted = Counter(
            "forge_draft_accepted", "drafted tokens the model accepted", ["model"], registry=registry
        )
        self._totals: dict[str, tuple[int, int]] = {}

    def count(self, model: str, body: bytes) -> None:
        found = drafted(body)
        if found is None:
            return
        n, accepted = found
        self.tokens.labels(model).inc(n)
        self.accepted.labels(model).inc(accepted)
        total_n, total_accepted = self._totals.get(model, (0, 0))
        self._totals[model] = (total_n + n, total_accepted + accepted)

    def rate(self, model: str) -> dict[str, Any]:
        """``draft_tokens``, ``draft_accepted`` and ``draft_acceptance`` (0..1) since the start;
        empty for a model that never drafted."""
        n, accepted = self._totals.get(model, (0, 0))
        if not n:
            return {}
        return {"draft_tokens": n, "draft_accepted": accepted, "draft_acceptance": round(accepted / n, 4)}
