"""The per-conversation disk tier of ``keep_context``: a chat's KV state saved after a long turn,
found again by the conversation's next turn, restored into a free slot when the child lost it.

A turn's state is saved under the hash of (model identity, API key name, the conversation's
messages up to and including the reply just produced); the next turn of the same conversation
sends those messages plus a new user message, so hashing its messages minus the last one finds
the save. The key name is in the hash: a state saved for one key is never found for another.

Forge sends every such turn to a slot it picks (``id_slot``) and keeps a book of what each slot
holds (:class:`~._keep_context.SlotBook`): the slot that still holds the conversation's last turn
serves it as it is; otherwise the saved state is restored into a free slot first, whatever lost
it (another conversation took the slot, the RAM cache let it go, the child was unloaded or
restarted, a new service). With API keys, a slot that may hold another key's conversation is
emptied before a turn that restores nothing. A restored turn the child did not reuse (llama.cpp
#26676) turns the tier off. Files live in the model's ``--slot-save-path`` directory as
``conv-<hash>`` entries of :class:`~._context_store.ContextStore` (the same manifests, 0600 files
and LRU byte budget as the planned-stop saves).

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import InstanceError
from ._context_store import SavedContext
from ._events import EventKind
from ._keep_context import child_key

if TYPE_CHECKING:
    from ._keep_context import ContextKeeper
    from ._managed import ManagedModel

__all__ = ["SAVE_MIN_TOKENS", "ConversationTurn", "conversation_hash", "is_conversation"]

log = logging.getLogger("rocmforge.supervisor")

#: A turn shorter than this (prompt + reply tokens) is not saved: recomputing ~500 tokens costs
#: about what a save and a restore do on a small model, and every save is a file write.
SAVE_MIN_TOKENS = 512
_STEM = "conv-"
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

    model: ManagedModel
    key: str | None
    body: dict[str, Any]
    messages: list[dict[str, Any]]
    raw: bytes
    slot: int | None = None
    restored: int = 0  # tokens restored into the slot before this turn

    @classmethod
    def of(cls, model: ManagedModel, key: str | None, raw: bytes) -> ConversationTurn | None:
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
        conversation's last turn is chosen when one does; otherwise the turn's saved state, when
        there is one, is restored into the slot first (the child lost it: fell out of its RAM
        cache, another conversation took the slot, the child was unloaded or restarted)."""
        server, plan = self.model.server, self.model.plan
        if server is None or plan is None or plan.slot_save_dir is None:  # keep_context is off
            return self.raw
        book = self.keeper.book
        book.for_child(server.pid or 0)
        if book.off is not None:
            return self.raw
        free = [s for s in await _idle_slots(server) if s not in book.claimed]
        if not free:  # no idle slot to restore into or save from: an ordinary request, which
            book.unknown()  # may land in any slot once one is free
            return self.raw
        resume = self._resume_stem()
        held = next((s for s in free if resume is not None and book.holds.get(s) == resume), None)
        # Otherwise a slot holding no tracked conversation, else the one holding the oldest.
        order = list(book.holds)
        slot = held if held is not None else min(free, key=lambda s: order.index(s) if s in order else -1)
        book.claimed.add(slot)
        book.holds.pop(slot, None)  # whatever it held is being replaced
        self.slot = slot
        counters = self.keeper.conversations
        foreign = self.key is not None and book.owners.get(slot, _ANYONE) != self.key
        book.owners[slot] = self.key
        if held is not None:
            counters.hits += 1  # served from the slot's own KV: nothing to restore
            return json.dumps({**self.body, "id_slot": slot}).encode()
        if resume is not None:
            entry = await anyio.to_thread.run_sync(self.keeper.store.entry, self.keeper.name, resume)
            if entry is None:
                counters.misses += 1
            else:
                counters.hits += 1
                await self._restore(entry)
        if foreign and not self.restored:
            await self._erase(slot)
        return json.dumps({**self.body, "id_slot": slot}).encode()

    async def _erase(self, slot: int) -> None:
        """The slot may hold another key's conversation: emptied first, so that llama-server's
        prefix reuse cannot answer this key faster for knowing another's prompt."""
        server = self.model.server
        assert server is not None
        try:
            await server.slot_action(slot, "erase")
        except InstanceError as exc:
            self._warn(f"{exc.message}; the slot was not emptied for another key's turn")

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

    async def _restore(self, entry: SavedContext) -> None:
        keeper, server = self.keeper, self.model.server
        assert server is not None and self.slot is not None and self.model.plan is not None
        why = entry.problem or (entry.key.mismatch(child_key(self.model.plan)) if entry.key else "no key")
        if why is not None:
            keeper._deleted(entry, f"conversation state unusable: {why}")
            return
        try:
            answer = await server.slot_action(self.slot, "restore", entry.filename)
        except InstanceError as exc:
            self._warn(f"{exc.message}; conversation state deleted, the turn computes cold")
            keeper._deleted(entry, "restore failed")
            return
        self.restored = int(answer.get("n_restored") or 0)
        self.keeper.conversations.restores += 1
        await anyio.to_thread.run_sync(keeper.store.touch, entry)
        self._moved(EventKind.CONTEXT_RESTORED, self.restored, entry)

    def _moved(self, kind: EventKind, tokens: int, entry: SavedContext) -> None:
        """A conversation's state went to its file or came back: the planned stop's event shape."""
        self.keeper._events.publish(
            self.keeper.name,
            kind,
            slot=self.slot,
            tokens=tokens,
            bytes=entry.bytes,
            file=entry.filename,
            conversation=True,
        )

    def _warn(self, message: str) -> None:
        self.keeper._warn(message)
        self.keeper.conversations.warnings += 1

    async def finish(self, content: bytes) -> None:
        """After a 200: the restore check, then which state the slot now holds, saved to disk
        when the turn was long enough (the state the turn continued from is then superseded)."""
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
        if not isinstance(message.get("content"), str):
            return
        if self.restored and not self._restore_checked(reused):
            return
        reply = {"role": "assistant", "content": message["content"]}
        stem = _STEM + self._hash([*self.messages, reply])
        book = self.keeper.book
        if server.pid == book.pid:
            book.holds[self.slot] = stem
        if total >= SAVE_MIN_TOKENS:
            await self._save(stem)

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

    def _restore_checked(self, reused: int | None) -> bool:
        """A restore the child did not reuse (it computed the prompt from 0: llama.cpp #26676 at
        some builds) turns the tier off for this run with a warning: saves that cannot help would
        only cost time. False then."""
        c = self.keeper.conversations
        if reused is None or reused > 0:
            c.prefill_saved += self.restored if reused is None else reused
            return True
        self.keeper.book.off = (
            f"a restored conversation state ({self.restored} tokens) was not reused: the child "
            "computed the prompt from 0 (llama.cpp #26676 at this build)"
        )
        self._warn(f"the per-conversation context tier is off: {self.keeper.book.off}")
        return False

    async def _save(self, stem: str) -> None:
        server, keeper = self.model.server, self.keeper
        assert server is not None and self.slot is not None and self.model.plan is not None
        temp = keeper.store.temp_name()
        try:
            saved = await server.slot_action(self.slot, "save", temp)
        except InstanceError as exc:
            keeper.store.discard(keeper.name, temp)
            self._warn(exc.message)
            return
        tokens = int(saved.get("n_saved") or 0)
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
            return
        c = keeper.conversations
        c.saves += 1
        c.saved_bytes += entry.bytes
        self._moved(EventKind.CONTEXT_SAVED, tokens, entry)
        keeper._apply_budget()
        await keeper.refresh()


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


async def _idle_slots(server: Any) -> list[int]:
    """The slots not processing (``GET /slots``); none when all are busy or it cannot say."""
    slots = await server.slots()
    if not isinstance(slots, list):
        return []
    return [
        int(s["id"])
        for s in slots
        if isinstance(s, dict) and not s.get("is_processing") and isinstance(s.get("id"), int)
    ]


def is_conversation(stem: str) -> bool:
    """A conversation's state, not a planned stop's slot save (those are restored at start)."""
    return stem.startswith(_STEM)
