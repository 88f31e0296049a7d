"""The per-conversation disk tier of ``keep_context``: a chat's KV state saved after a long turn,
found again by the conversation's next turn, restored into a free slot when the child lost it.

A turn's state is saved under the hash of (model identity, API key name, the conversation's
messages up to and including the reply just produced); the next turn of the same conversation
sends those messages plus a new user message, so hashing its messages minus the last one finds
the save. The key name is in the hash: a state saved for one key is never found for another.

Forge sends every such turn to a slot it picks (``id_slot``) and keeps a book of what each slot
holds (:class:`~._keep_context.SlotBook`). Before a turn it asks the child what each slot really
holds (``GET /slots``: llama-server empties idle slots whenever a KV cache shared by the slots runs
full, and says so only in its log): the slot that still holds the conversation's last turn serves
it as it is; otherwise the saved state is restored into a free slot first, whatever lost it
(another conversation took the slot or pushed it out of the shared cache, the RAM cache let it go,
the child was unloaded or restarted, a new service), with room made for it in a shared cache by
emptying the idle slots whose states are oldest. With API keys, a slot that may hold another
key's conversation is emptied before a turn that restores nothing. What the child reused
(``timings.cache_n``) decides afterwards whether the turn counts as a hit or a miss; a restored
turn the child did not reuse at all while no other request ran (llama.cpp #26676) turns the tier
off. Files live in the model's ``--slot-save-path`` directory as ``conv-<hash>`` entries of
:class:`~._context_store.ContextStore` (the same manifests, 0600 files and LRU byte budget as the
planned-stop saves).

Only ``/v1/chat/completions`` (streamed or not; Ollama's chat reaches the child as one) with plain
``role``/``content`` messages take part: anything else (tools, images, other routes, Anthropic's
``/v1/messages``, whose converter in llama-server drops ``id_slot``) is passed through untouched, and voids
what forge knew of the child's slots (it may have taken any). Every failure is a warning event and a
cold request: this is an optimisation, never a reason for a request to fail.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from ..._argv import kv_unified_in_args
from ..._errors import InstanceError
from .._events import EventKind
from ._context_store import SavedContext
from ._keep_context import SlotState, child_key

if TYPE_CHECKING:
    from ...process import ModelServer
    from ..launch._launch import LaunchPlan
    from ._keep_context import ContextKeeper, SlotBook

__all__ = ["SAVE_MIN_TOKENS", "ConversationTurn", "conversation_hash", "is_conversation"]

log = logging.getLogger("rocmforge.supervisor")


class TurnModel(Protocol):
    """What a turn reads of its model (``ManagedModel`` satisfies it): its kept contexts, its child
    and that child's plan, and how many requests it serves now."""

    @property
    def contexts(self) -> ContextKeeper | None: ...
    @property
    def server(self) -> ModelServer | None: ...
    @property
    def plan(self) -> LaunchPlan | None: ...
    @property
    def in_flight(self) -> int: ...


#: A turn shorter than this (prompt + reply tokens) is not saved: recomputing ~500 tokens costs
#: about what a save and a restore do on a small model, and every save is a file write.
SAVE_MIN_TOKENS = 512
_STEM = "conv-"
#: How long a turn waits for ``GET /slots`` (llama-server answers it even while it computes; a
#: loaded box may take seconds). Past it the turn is sent as an ordinary request.
_SLOTS_TIMEOUT = 10.0
_ANYONE = "\x00anyone"  # an owner no key name can be: a slot forge knows nothing of


def _plain(messages: object) -> list[dict[str, Any]] | None:
    """The messages as ``{role, content}`` only; None when any carries more (tools, names...)."""
    if not isinstance(messages, list) or not messages:
        return None
    out: list[dict[str, Any]] = []
    for m in messages:
        if not isinstance(m, dict) or set(m) - {"role", "content"} or not isinstance(m.get("role"), str):
            return None
        out.append({"role": m["role"], "content": m.get("content")})
    return out


def conversation_hash(identity: dict[str, Any], key: str | None, messages: list[dict[str, Any]]) -> str:
    """The saved state's name for this model child identity, API key name and message prefix."""
    text = json.dumps({"id": identity, "key": key or "", "messages": messages}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


@dataclass
class ConversationTurn:
    """One chat request's part in the tier: :meth:`prepare` before it is sent (restore, pick the
    slot), :meth:`finish` after its answer while the gateway slot is still held (save)."""

    model: TurnModel
    key: str | None
    body: dict[str, Any]
    messages: list[dict[str, Any]]
    raw: bytes
    slot: int | None = None
    restored: int = 0  # tokens restored into the slot before this turn
    found: int = 0  # tokens of its state the slot still held when the turn was sent there
    returning: bool = False  # it continues an earlier turn: counted as a hit or a miss
    alone: bool = True  # no other request was in flight at the model when it was prepared

    @classmethod
    def of(cls, model: TurnModel, key: str | None, raw: bytes) -> ConversationTurn | None:
        """The turn of a request that may take part; None for any other."""
        if model.contexts is None:  # whether its child keeps context: known once it is loaded
            return None
        try:
            body = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(body, dict) or "id_slot" in body:
            return None
        messages = _plain(body.get("messages"))
        if messages is None:
            return None
        return cls(model, key, body, messages, raw)

    @property
    def keeper(self) -> ContextKeeper:
        assert self.model.contexts is not None
        return self.model.contexts

    def _hash(self, messages: list[dict[str, Any]]) -> str:
        assert self.model.plan is not None
        return conversation_hash(child_key(self.model.plan).to_json(), self.key, messages)

    async def prepare(self) -> bytes:
        """The body to send: with ``id_slot`` set to a free slot. The slot that still holds this
        conversation's last turn (as the child reports it now) is chosen when one does; otherwise
        the turn's saved state, when there is one, is restored into the slot first (the child
        lost it: pushed out of a full shared cache, fell out of its RAM cache, another
        conversation took the slot, the child was unloaded or restarted)."""
        server, plan = self.model.server, self.model.plan
        if server is None or plan is None or plan.slot_save_dir is None:  # keep_context is off
            return self.raw
        book = self.keeper.book
        book.for_child(server.pid or 0)
        if book.off is not None:
            return self.raw
        async with book.lock:
            return await self._prepare(server, book)

    async def _prepare(self, server: ModelServer, book: SlotBook) -> bytes:
        slots = SlotState.parse(await server.slots(timeout=_SLOTS_TIMEOUT))
        free = {s.id: s for s in slots if not s.processing and s.id not in book.claimed}
        if not free:  # no idle slot to restore into or save from: an ordinary request, which
            book.unknown()  # may land in any slot once one is free
            return self.raw
        for state in free.values():  # what the child emptied since (a full shared cache)
            if state.id in book.holds and not book.still_holds(state):
                book.forget(state.id)
        resume = self._resume_stem()
        self.returning = resume is not None
        self.alone = self.model.in_flight <= 1
        held = next((s for s in free if resume is not None and book.holds.get(s) == resume), None)
        # Otherwise an empty slot, else one holding no tracked conversation, else the oldest's.
        slot = held if held is not None else min(free, key=lambda s: (free[s].tokens != 0, book.age(s)))
        self.found = book.tokens.get(slot, 0) if held is not None else 0
        book.claimed.add(slot)
        book.forget(slot)  # whatever it held is being replaced
        self.slot = slot
        foreign = self.key is not None and book.owners.get(slot, _ANYONE) != self.key
        book.owners[slot] = self.key
        if held is None and resume is not None:
            entry = await anyio.to_thread.run_sync(self.keeper.store.entry, self.keeper.name, resume)
            if entry is not None:
                await self._restore(entry, slots)
        if foreign and not self.restored and held is None:
            await self._erase(slot)
        return json.dumps({**self.body, "id_slot": slot}).encode()

    async def _erase(self, slot: int) -> bool:
        """The slot may hold another key's conversation, or its tokens are needed to make room in
        a shared cache: emptied (then llama-server's prefix reuse cannot answer this key faster
        for knowing another's prompt). False when the child refused."""
        server = self.model.server
        assert server is not None
        try:
            await server.slot_action(slot, "erase")
        except InstanceError as exc:
            self._warn(f"{exc.message}; the slot was not emptied")
            return False
        self.keeper.book.forget(slot)
        return True

    def _resume_stem(self) -> str | None:
        """The saved state this turn continues from: the conversation minus its new user message
        (a first turn, with no answer in it yet, continues from nothing)."""
        earlier = self.messages[:-1]
        if self.messages[-1]["role"] == "user" and any(m["role"] == "assistant" for m in earlier):
            return _STEM + self._hash(earlier)
        return None

    def release(self) -> None:
        """The turn is over (answered, failed or cancelled): its slot may be chosen again."""
        if self.slot is not None:
            self.keeper.book.claimed.discard(self.slot)

    def _shared(self) -> bool:
        """Whether the child's slots share one KV cache (``--kv-unified`` with more than one
        slot): a restore then needs free cells that other slots may hold, and llama-server empties
        idle slots on its own when the cache runs full."""
        spec = self.model.plan.spec if self.model.plan is not None else None
        return spec is not None and (spec.parallel or 1) > 1 and kv_unified_in_args(spec.extra_args) is True

    def _victims(self, slots: list[SlotState]) -> list[SlotState]:
        """The idle slots, other than this turn's, that no turn has claimed and that may hold
        tokens: the ones whose count is known first (one holding no tracked state, then the
        oldest state's: a long one is on disk), then those the child gives no count for (no task
        yet: empty, or holding what the start restored)."""
        book = self.keeper.book
        return sorted(
            (
                s
                for s in slots
                if s.id != self.slot and not s.processing and s.id not in book.claimed and s.tokens != 0
            ),
            key=lambda s: (s.tokens is None, book.age(s.id)),
        )

    async def _make_room(self, tokens: int, slots: list[SlotState]) -> bool:
        """Free cells for a ``tokens``-token restore into this turn's slot: in a shared cache,
        :meth:`_victims` are emptied until the restore fits. False when it cannot fit (busy slots
        hold the rest): the turn then computes its prompt, its state stays on disk."""
        if not self._shared():
            return True  # a slot's own cache: the restore replaces what it holds
        n_ctx = max((s.n_ctx for s in slots if s.n_ctx), default=0)
        if not n_ctx:
            return True  # the child does not say: the restore finds out
        room = n_ctx - sum(s.tokens or 0 for s in slots if s.id != self.slot)
        for victim in self._victims(slots):
            if room >= tokens:
                break
            if await self._erase(victim.id):
                room += victim.tokens or 0
                log.info(
                    "model %s: emptied slot %d (%s tokens) for a conversation's state (%d tokens) in slot %d",
                    self.keeper.name,
                    victim.id,
                    "unknown" if victim.tokens is None else victim.tokens,
                    tokens,
                    self.slot,
                )
        return room >= tokens

    async def _restore(self, entry: SavedContext, slots: list[SlotState]) -> None:
        keeper, server = self.keeper, self.model.server
        assert server is not None and self.slot is not None and self.model.plan is not None
        why = entry.problem or (entry.key.mismatch(child_key(self.model.plan)) if entry.key else "no key")
        if why is not None:
            keeper._deleted(entry, f"conversation state unusable: {why}")
            return
        if not await self._make_room(entry.tokens, slots):
            log.info(
                "model %s: no room in the shared KV cache for a conversation's state (%d tokens): "
                "the turn computes its prompt",
                keeper.name,
                entry.tokens,
            )
            return
        started = time.monotonic()
        try:
            try:
                answer = await server.slot_action(self.slot, "restore", entry.filename)
            except InstanceError as exc:
                unknown = [s for s in self._victims(slots) if s.tokens is None]
                if not self._shared() or exc.reason == "slots_unreachable" or not unknown:
                    raise
                # Slots that give no count may hold what the start restored: emptied, once more.
                for victim in unknown:
                    await self._erase(victim.id)
                answer = await server.slot_action(self.slot, "restore", entry.filename)
        except InstanceError as exc:
            if self._shared() or exc.reason == "slots_unreachable":
                # At this llama.cpp a shared cache without room and a bad file are one message: the
                # state is kept, the budget's first to go.
                self._warn(f"{exc.message}; the turn computes its prompt")
                await anyio.to_thread.run_sync(lambda: keeper.store.touch(entry, demote=True))
            else:
                self._warn(f"{exc.message}; conversation state deleted, the turn computes cold")
                keeper._deleted(entry, "restore failed")
            return
        self.restored = int(answer.get("n_restored") or 0)
        self.keeper.conversations.restores += 1
        await anyio.to_thread.run_sync(keeper.store.touch, entry)
        self._moved(EventKind.CONTEXT_RESTORED, self.restored, entry, answer, started)

    def _moved(
        self, kind: EventKind, tokens: int, entry: SavedContext, answer: dict[str, Any], started: float
    ) -> None:
        """A conversation's state went to its file or came back: the planned stop's event shape,
        with its two times (``ms``: the whole action as forge waited for it, the file's commit
        included; ``save_ms``/``restore_ms``: llama-server's own, the file alone)."""
        timing = "save_ms" if kind == EventKind.CONTEXT_SAVED else "restore_ms"
        self.keeper._events.publish(
            self.keeper.name,
            kind,
            slot=self.slot,
            tokens=tokens,
            bytes=entry.bytes,
            ms=round((time.monotonic() - started) * 1000, 3),
            **{timing: (answer.get("timings") or {}).get(timing)},
            file=entry.filename,
            conversation=True,
        )

    def _warn(self, message: str) -> None:
        self.keeper._warn(message)
        self.keeper.conversations.warnings += 1

    async def finish(self, content: bytes) -> None:
        """After a 200: the turn counted (what the child reused), then which state the slot now
        holds, saved to disk when the turn was long enough (the state the turn continued from is
        then superseded)."""
        try:
            answer = json.loads(content)
        except ValueError:
            return
        if isinstance(answer, dict):
            await self._finished(answer)

    async def _finished(self, answer: dict[str, Any]) -> None:
        """:meth:`finish` on the parsed answer (a whole one, or a stream's events put together)."""
        server = self.model.server
        if server is None or self.slot is None or self.model.plan is None:
            return
        try:
            message = answer["choices"][0]["message"]
            usage = answer.get("usage") or {}
            total = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
            reused = _reused(answer)
        except (KeyError, IndexError, TypeError, ValueError):
            return
        if self.returning and not self._counted(reused):
            return
        if not isinstance(message.get("content"), str):
            return
        reply = {"role": "assistant", "content": message["content"]}
        stem = _STEM + self._hash([*self.messages, reply])
        saved = await self._save(stem) if total >= SAVE_MIN_TOKENS else None
        book = self.keeper.book
        if server.pid != book.pid:
            return
        if saved is None:  # not saved: the slot holds about the turn's tokens
            book.held(self.slot, stem, total, exact=False)
        elif saved > 0:
            book.held(self.slot, stem, saved, exact=True)
        else:  # emptied before the save could read it (a full shared cache)
            book.forget(self.slot)

    async def finish_stream(self, events: bytes) -> None:
        """After a stream that ended with ``[DONE]``: the answer its events spelled out (the
        content deltas, the last ``usage`` and ``timings``), then as :meth:`finish`."""
        content: list[str] = []
        whole: dict[str, Any] = {}
        for line in events.split(b"\n"):
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            try:
                event = json.loads(line[6:])
                delta = (event.get("choices") or [{}])[0].get("delta") or {}
            except (ValueError, AttributeError, IndexError):
                return  # not the chat stream this was sent for: nothing is kept
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            for key in ("usage", "timings"):
                if isinstance(event.get(key), dict):
                    whole[key] = event[key]
        usage = whole.get("usage") or {}
        timings = whole.get("timings") or {}
        if not usage and timings:  # without stream_options.include_usage: the child's own counts
            prompt = int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0))
            usage = {"prompt_tokens": prompt, "completion_tokens": int(timings.get("predicted_n", 0))}
        await self._finished(
            {"choices": [{"message": {"content": "".join(content)}}], **whole, "usage": usage}
        )

    def _counted(self, reused: int | None) -> bool:
        """A returning turn counted by what the child reused (``reused``: its ``cache_n``): a hit
        when it took at least half of the state found in its slot or restored into it, else a
        miss (no state, or the slot lost it before the turn started). A restored state the child
        did not reuse at all while no other request ran (llama.cpp #26676 at some builds: the
        restore reports its tokens and leaves the slot empty) turns the tier off for this run
        with a warning: saves that cannot help would only cost time. False then."""
        c = self.keeper.conversations
        state = self.restored or self.found
        if state and (reused is None or 2 * reused >= state):
            c.hits += 1
            if self.restored:
                c.prefill_saved += self.restored if reused is None else reused
            return True
        c.misses += 1
        if not self.restored or reused != 0 or not self.alone or self.model.in_flight > 1:
            return True  # with other requests running, the child may have emptied it for them
        self.keeper.book.off = (
            f"a restored conversation state ({self.restored} tokens) was not reused: the child "
            "computed the prompt from 0 (llama.cpp #26676 at this build)"
        )
        self._warn(f"the per-conversation context tier is off: {self.keeper.book.off}")
        return False

    async def _save(self, stem: str) -> int | None:
        """The slot saved as ``stem``: the tokens saved (0: the child had emptied the slot,
        nothing kept), None when it could not be saved."""
        server, keeper = self.model.server, self.keeper
        assert server is not None and self.slot is not None and self.model.plan is not None
        temp = keeper.store.temp_name()
        started = time.monotonic()
        try:
            saved = await server.slot_action(self.slot, "save", temp)
        except InstanceError as exc:
            keeper.store.discard(keeper.name, temp)
            self._warn(exc.message)
            return None
        tokens = int(saved.get("n_saved") or 0)
        if tokens <= 0:  # emptied between the answer and the save (a full shared cache)
            keeper.store.discard(keeper.name, temp)
            return 0
        key = child_key(self.model.plan)
        resumed = self._resume_stem()
        slot = self.slot

        def commit() -> SavedContext:
            entry = keeper.store.commit(keeper.name, temp, slot=slot, tokens=tokens, key=key, stem=stem)
            # The state this turn continued from is a prefix of the new one: the budget removes it
            # first. Kept until then: a client that sends this turn again (regenerate) finds it.
            old = keeper.store.entry(keeper.name, resumed) if resumed is not None else None
            if old is not None and old.problem is None:
                keeper.store.touch(old, demote=True)
            return entry

        try:
            entry = await anyio.to_thread.run_sync(commit)
        except OSError as exc:
            keeper.store.discard(keeper.name, temp)
            self._warn(f"could not keep a conversation's state: {exc.strerror or exc}")
            return None
        c = keeper.conversations
        c.saves += 1
        c.saved_bytes += entry.bytes
        self._moved(EventKind.CONTEXT_SAVED, tokens, entry, saved, started)
        keeper._apply_budget()
        await keeper.refresh()
        return tokens


def _reused(answer: dict[str, Any]) -> int | None:
    """The prompt tokens the child took from its slot instead of computing (``timings.cache_n``,
    or the OpenAI usage's ``cached_tokens``); None when the answer does not say."""
    timings = answer.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
        return int(timings["cache_n"])
    details = (answer.get("usage") or {}).get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        return int(details["cached_tokens"])
    return None


def is_conversation(stem: str) -> bool:
    """A conversation's state, not a planned stop's slot save (those are restored at start)."""
    return stem.startswith(_STEM)
