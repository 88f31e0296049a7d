"""``keep_context``: a model's KV-cache slots saved at a planned stop, restored at its next start.

:class:`ContextKeeper` is the part of a child's planned stop and start that talks to the child's
``/slots`` actions; the files are :class:`~._context_store.ContextStore`'s. Every failure here (a
full disk, a corrupt file, a child that refuses) is a ``context_warning`` event and a normal cold
start: keeping context is an optimisation, never a reason for a load or an unload to fail.

A crash cannot save (the child is gone): the last planned stop's files are what comes back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from ..._errors import InstanceError
from ...process import ModelServer
from .._events import EventBus, EventKind
from ..launch._launch import LaunchPlan
from ._context_store import ContextKey, ContextStore, ContextSummary, SavedContext, context_key

__all__ = ["ContextCounters", "ContextKeeper", "SlotBook", "SlotState", "child_key"]

log = logging.getLogger("rocmforge.supervisor")

#: Bound of a whole restore (llama-server reads a 158 MB slot in ~15 ms; a slow disk and a few GB
#: of slots still fit). Past it the model starts with what was restored so far.
RESTORE_TIMEOUT = 60.0


def child_key(plan: LaunchPlan) -> ContextKey:
    """What the slots of the child ``plan`` starts will be valid for."""
    spec = plan.spec
    return context_key(
        model_path=plan.model_path,
        binary=spec.binary,
        ctx_size=spec.ctx_size,
        parallel=spec.parallel,
        args=spec.extra_args,
    )


@dataclass
class ConversationCounters:
    """The per-conversation tier's totals since this ``forge serve`` started (:mod:`._conversations`).
    A returning turn (history present) is counted once its answer says what the child reused
    (``timings.cache_n``): a hit or a miss, never both."""

    hits: int = 0  # a returning turn the child answered from its saved state (in its slot or restored)
    misses: int = 0  # a returning turn the child computed: no saved state, or it could not be used
    restores: int = 0  # saved states restored from disk into a slot (the child had lost them)
    saves: int = 0
    saved_bytes: int = 0
    prefill_saved: int = 0  # tokens restored instead of computed
    warnings: int = 0


@dataclass(frozen=True)
class SlotState:
    """One slot as ``GET /slots`` reports it: ``tokens`` is what its KV cache holds now
    (``n_prompt_tokens``: 0 once llama-server emptied it; None before its first task, or from a
    build that does not say), ``n_ctx`` the context it may use (the whole cache when the slots
    share one)."""

    id: int
    processing: bool
    tokens: int | None = None
    n_ctx: int | None = None

    @classmethod
    def parse(cls, answer: object) -> list[SlotState]:
        """The slots of a ``GET /slots`` answer; none when it is not one."""
        if not isinstance(answer, list):
            return []
        out = []
        for s in answer:
            if not isinstance(s, dict) or not isinstance(s.get("id"), int):
                continue
            tokens, n_ctx = s.get("n_prompt_tokens"), s.get("n_ctx")
            out.append(
                cls(
                    int(s["id"]),
                    bool(s.get("is_processing")),
                    tokens if isinstance(tokens, int) else None,
                    n_ctx if isinstance(n_ctx, int) else None,
                )
            )
        return out


@dataclass
class SlotBook:
    """What the per-conversation tier knows of the running child's slots: which conversation
    state each slot held after a tier turn, and how many tokens (the next turn goes back there
    without a restore once ``GET /slots`` confirms the slot still holds them: llama-server empties
    idle slots when a shared cache runs full), which slots a tier turn in flight has claimed (two
    turns never restore into one slot), and whether the tier is off for this run, and why (the
    restore check, llama.cpp #26676)."""

    pid: int = 0
    holds: dict[int, str] = field(default_factory=dict)  # slot -> state stem, oldest first
    #: slot -> the tokens it held after that turn (the save's ``n_saved``, else the turn's count)
    tokens: dict[int, int] = field(default_factory=dict)
    #: the slots whose count is a save's own: ``GET /slots`` must then report exactly it
    exact: set[int] = field(default_factory=set)
    #: slot -> the API key name whose turn last used it; a slot missing here may hold anyone's.
    owners: dict[int, str | None] = field(default_factory=dict)
    claimed: set[int] = field(default_factory=set)
    off: str | None = None
    #: One tier turn at a time reads the slots, makes room and restores (the answers do not wait
    #: on it): two restores never count on the same free cells of a shared cache.
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    def for_child(self, pid: int) -> None:
        """A new child holds nothing of the old one's slots."""
        if pid != self.pid:
            self.pid = pid
            self.unknown()
            self.claimed.clear()

    def unknown(self) -> None:
        """A request outside the tier went to the child: any slot may now hold something else."""
        self.holds.clear()
        self.tokens.clear()
        self.exact.clear()
        self.owners.clear()

    def held(self, slot: int, stem: str, tokens: int, *, exact: bool) -> None:
        """After a tier turn: ``slot`` holds ``stem``'s state, ``tokens`` of it (now the newest)."""
        self.forget(slot)
        self.holds[slot] = stem
        self.tokens[slot] = tokens
        if exact:
            self.exact.add(slot)

    def forget(self, slot: int) -> None:
        """``slot`` no longer holds what the book said (replaced, emptied, erased)."""
        self.holds.pop(slot, None)
        self.tokens.pop(slot, None)
        self.exact.discard(slot)

    def still_holds(self, state: SlotState) -> bool:
        """Whether the slot still holds what the book says: ``GET /slots`` reports tokens in it
        (exactly the save's count, when a save counted them). A slot the child emptied (a full
        shared cache, an erase) reports 0; a build that reports no count is never trusted."""
        if state.id not in self.holds or state.tokens is None or state.tokens <= 0:
            return False
        return state.id not in self.exact or state.tokens == self.tokens.get(state.id)

    def age(self, slot: int) -> int:
        """The order in which slots are given up: -1 for one holding no tracked state, then 0
        for the one whose state is the oldest, and so on."""
        order = list(self.holds)
        return order.index(slot) if slot in order else -1


@dataclass
class ContextCounters:
    """Totals since this ``forge serve`` started (``/metrics``)."""

    saves: int = 0
    restores: int = 0
    saved_bytes: int = 0
    restored_bytes: int = 0
    restore_seconds: float = 0.0
    deleted: int = 0
    warnings: int = 0


class ContextKeeper:
    """One model's saved contexts: save at a planned stop, restore at a start, forget on request."""

    def __init__(self, name: str, store: ContextStore, events: EventBus) -> None:
        self.name, self.store, self._events = name, store, events
        self.counters = ContextCounters()
        #: The per-conversation tier's totals and its book of the child's slots (:mod:`._conversations`).
        self.conversations = ConversationCounters()
        self.book = SlotBook()

    def slot_dir(self) -> Path | None:
        """The directory for the child's ``--slot-save-path``; None (with a warning) when it cannot
        be made: the model then starts without keeping context."""
        try:
            return self.store.directory(self.name)
        except OSError as exc:
            self._warn(f"cannot create {self.store.root}: {exc.strerror or exc}; context is not kept")
            return None

    def summary(self) -> ContextSummary:
        """As last read (``status()`` runs on the event loop: no disk there); see :meth:`refresh`."""
        return self.store.known_summary(self.name)

    async def refresh(self) -> None:
        """Re-read the saved contexts' summaries in a thread, after this keeper changed them."""
        with anyio.CancelScope(shield=True):  # quick, and a stop must not leave it stale
            await anyio.to_thread.run_sync(self.store.refresh, [self.name])

    def forget(self) -> int:
        n = self.store.forget(self.name)
        if n:
            self.counters.deleted += n
            self._events.publish(self.name, EventKind.CONTEXT_DELETED, reason="forget", count=n)
        return n

    # -- the stop ------------------------------------------------------------------------------

    async def save(self, server: ModelServer, plan: LaunchPlan, *, timeout: float) -> list[SavedContext]:
        """Save every slot that holds tokens, within ``timeout`` (what is not done by then is
        dropped). The model's earlier saves are replaced by these; then the budget is applied."""
        key = child_key(plan)
        saved: list[SavedContext] = []
        temp: str | None = None
        with anyio.move_on_after(timeout) as scope:
            for slot in range(plan.spec.parallel or 1):
                temp = self.store.temp_name()
                entry = await self._save_one(server, slot, temp, key)
                temp = None
                if entry is not None:
                    saved.append(entry)
        if scope.cancelled_caught:
            # llama-server may still be writing it; the sweep after the stop removes what it leaves.
            if temp is not None:
                self.store.discard(self.name, temp)
            self._warn(f"saving the slots took longer than {timeout:g} s: the rest was dropped")
        if saved:
            for old in self.store.replace_older(self.name, saved):
                self._deleted(old, "replaced by a newer save")
            self._apply_budget()
        await self.refresh()
        return saved

    async def _save_one(
        self, server: ModelServer, slot: int, temp: str, key: ContextKey
    ) -> SavedContext | None:
        started = time.monotonic()
        try:
            answer = await server.slot_action(slot, "save", temp)
        except InstanceError as exc:
            self.store.discard(self.name, temp)
            self._warn(exc.message)
            return None
        tokens = int(answer.get("n_saved") or 0)
        if tokens <= 0:  # an empty slot: nothing to keep
            self.store.discard(self.name, temp)
            return None
        try:
            # Renames and an fsync'd manifest: off the event loop (a busy disk can take a while).
            entry = await anyio.to_thread.run_sync(
                lambda: self.store.commit(self.name, temp, slot=slot, tokens=tokens, key=key)
            )
        except OSError as exc:  # a full disk, a removed directory
            self.store.discard(self.name, temp)
            self._warn(f"could not keep the save of slot {slot}: {exc.strerror or exc}")
            return None
        self.counters.saves += 1
        self.counters.saved_bytes += entry.bytes
        ms = self._moved(
            EventKind.CONTEXT_SAVED, slot, tokens, entry, answer, timing="save_ms", started=started
        )
        log.info(
            "model %s: saved slot %d (%d tokens, %d bytes) in %s", self.name, slot, tokens, entry.bytes, ms
        )
        return entry

    def after_stop(self) -> None:
        """The child is gone: what a dropped save left behind goes."""
        self.store.sweep(self.name)

    # -- the start -----------------------------------------------------------------------------

    async def restore(self, server: ModelServer, plan: LaunchPlan) -> int:
        """Before the first request is let through: the most recent saves that fit this child, one
        per slot. Saves for another model file, KV layout or build are deleted, never loaded; an
        unusable one is a warning and is deleted. Returns the number restored."""
        self.store.sweep(self.name)
        key = child_key(plan)
        slots = plan.spec.parallel or 1
        restored = 0
        with anyio.move_on_after(RESTORE_TIMEOUT) as scope:
            for entry in self.store.entries(self.name):
                if entry.stem.startswith("conv-"):
                    continue  # a conversation's state: restored by its next turn, not at start
                if entry.problem is not None:
                    self._warn(f"saved context {entry.stem} is unusable ({entry.problem}): deleted")
                    self._deleted(entry, "unusable")
                    continue
                why = entry.key.mismatch(key) if entry.key else "no key"
                if why is not None:
                    self._deleted(entry, f"does not match the new child: {why}")
                    continue
                if restored >= slots:
                    continue  # kept until the next save replaces it (or the budget removes it)
                done = await self._restore_one(server, restored, entry)
                if done is None:
                    break  # the child went away (a stop, a crash): the saves stay for the next one
                if done:
                    restored += 1
        if scope.cancelled_caught:
            self._warn(f"restoring took longer than {RESTORE_TIMEOUT:g} s: the rest starts cold")
        await self.refresh()
        return restored

    async def _restore_one(self, server: ModelServer, slot: int, entry: SavedContext) -> bool | None:
        """True: restored; False: the child refused it (deleted); None: the child did not answer."""
        started = time.monotonic()
        try:
            answer = await server.slot_action(slot, "restore", entry.filename)
        except InstanceError as exc:
            if exc.reason == "slots_unreachable" or not server.alive:
                self._warn(f"{exc.message}; kept for the next start")
                return None
            self._warn(f"{exc.message}; deleted, slot {slot} starts cold")
            self._deleted(entry, "restore failed")
            return False
        seconds = time.monotonic() - started
        await anyio.to_thread.run_sync(self.store.touch, entry)
        tokens = int(answer.get("n_restored") or 0)
        self.counters.restores += 1
        self.counters.restored_bytes += entry.bytes
        self.counters.restore_seconds += seconds
        ms = self._moved(
            EventKind.CONTEXT_RESTORED, slot, tokens, entry, answer, timing="restore_ms", started=started
        )
        log.info("model %s: restored slot %d (%d tokens) in %s", self.name, slot, tokens, ms)
        return True

    # -- bookkeeping ---------------------------------------------------------------------------

    def _apply_budget(self) -> None:
        for e in self.store.enforce_budget():
            self._deleted(
                e, f"over context_max_bytes ({self.store.max_bytes} bytes)", model=e.model or self.name
            )

    def _moved(
        self,
        kind: EventKind,
        slot: int,
        tokens: int,
        entry: SavedContext,
        answer: Mapping[str, Any],
        *,
        timing: str,
        started: float,
    ) -> str:
        """A slot went to its file or came back from it: one event shape for both ways, with two
        times that are not the same span: ``ms``, the whole action as forge waited for it (the HTTP
        call; what the log says), and the child's own timing of the file's read or write alone
        (``timing``: the key of ``answer["timings"]``, kept as the field; often well under 1 ms).
        The page and the log once showed one each, which read like a unit error (0.533 ms vs
        0.011 s). Returns the text both print."""
        elapsed_ms = round((time.monotonic() - started) * 1000, 3)
        child_ms = (answer.get("timings") or {}).get(timing)
        self._events.publish(
            self.name,
            kind,
            slot=slot,
            tokens=tokens,
            bytes=entry.bytes,
            ms=elapsed_ms,
            **{timing: child_ms},
            file=entry.filename,
        )
        own = f" (llama-server: {child_ms:.3g} ms)" if isinstance(child_ms, int | float) else ""
        return f"{elapsed_ms:.3g} ms{own}"

    def _deleted(self, entry: SavedContext, reason: str, *, model: str | None = None) -> None:
        self.store.delete(entry)
        self.counters.deleted += 1
        self._events.publish(
            model or self.name,
            EventKind.CONTEXT_DELETED,
            reason=reason,
            file=entry.filename,
            tokens=entry.tokens,
        )

    def _warn(self, message: str) -> None:
        self.counters.warnings += 1
        self._events.publish(self.name, EventKind.CONTEXT_WARNING, message=message)
        log.warning("model %s: %s", self.name, message, extra={"model": self.name})
