"""The per-conversation disk tier of ``keep_context``: a chat's KV state saved after a long turn,
found again by the conversation's next turn, restored into a free slot when the child lost it.

A turn's state is saved under the hash of (model identity, API key name, the conversation's
messages up to and including the reply just produced); the next turn of the same conversation
sends those messages plus a new user message, so hashing its messages minus the last one finds
the save. The key name is in the hash: a state saved for one key is never found for another.

The child's own RAM prompt cache serves a conversation that never left it; a restore is only
needed when the child that saved the state is gone (unloaded, restarted, a new service). Forge
tracks which child (pid) saved each state during this run; a state whose child is still the
running one is a hit served from the child's memory, not restored. Files live in the model's
``--slot-save-path`` directory as ``conv-<hash>`` entries of :class:`~._context_store.ContextStore`
(the same manifests, 0600 files and LRU byte budget as the planned-stop saves).

Only non-streamed ``/v1/chat/completions`` with plain ``role``/``content`` messages take part:
anything else (tools, streams) is passed through untouched. Every failure is a warning event and a
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

    @classmethod
    def of(cls, model: ManagedModel, key: str | None, raw: bytes) -> ConversationTurn | None:
        """The turn of a request that may take part; None for any other."""
        if model.contexts is None:  # whether its child keeps context: known once it is loaded
            return None
        try:
            body = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(body, dict) or body.get("stream") or "id_slot" in body:
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
        """The body to send: with ``id_slot`` set to a free slot, whose state is restored first
        when this conversation's previous turn was saved by a child that is gone."""
        server, plan = self.model.server, self.model.plan
        if server is None or plan is None or plan.slot_save_dir is None:  # keep_context is off
            return self.raw
        self.slot = await _idle_slot(server)
        if self.slot is None:  # no idle slot to restore into or save from: an ordinary request
            return self.raw
        counters = self.keeper.conversations
        if len(self.messages) >= 2 and self.messages[-1]["role"] == "user":
            stem = _STEM + self._hash(self.messages[:-1])
            entries = await anyio.to_thread.run_sync(self.keeper.store.entries, self.keeper.name)
            entry = next((e for e in entries if e.stem == stem), None)
            if entry is None:
                counters.misses += 1
            else:
                counters.hits += 1
                saved_by = self.keeper.held.get(stem)
                if saved_by != server.pid:
                    await self._restore(entry)
        body = {**self.body, "id_slot": self.slot}
        return json.dumps(body).encode()

    async def _restore(self, entry: Any) -> None:
        keeper, server = self.keeper, self.model.server
        assert server is not None and self.slot is not None and self.model.plan is not None
        why = entry.problem or (entry.key.mismatch(child_key(self.model.plan)) if entry.key else "no key")
        if why is not None:
            keeper._deleted(entry, f"conversation state unusable: {why}")
            return
        try:
            answer = await server.slot_action(self.slot, "restore", entry.filename)
        except InstanceError as exc:
            keeper._warn(f"{exc.message}; conversation state deleted, the turn computes cold")
            keeper._deleted(entry, "restore failed")
            self.keeper.conversations.warnings += 1
            return
        tokens = int(answer.get("n_restored") or 0)
        c = keeper.conversations
        c.restores += 1
        c.prefill_saved += tokens
        keeper.held[entry.stem] = server.pid or 0
        await anyio.to_thread.run_sync(keeper.store.touch, entry)
        keeper._events.publish(
            keeper.name,
            EventKind.CONTEXT_RESTORED,
            slot=self.slot,
            tokens=tokens,
            bytes=entry.bytes,
            file=entry.filename,
            conversation=True,
        )

    async def finish(self, content: bytes) -> None:
        """After a 200: save the slot when the turn was long enough, named for the next turn."""
        server = self.model.server
        if server is None or self.slot is None or self.model.plan is None:
            return
        try:
            answer = json.loads(content)
            message = answer["choices"][0]["message"]
            usage = answer.get("usage") or {}
            total = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
        except (ValueError, KeyError, IndexError, TypeError):
            return
        if total < SAVE_MIN_TOKENS or not isinstance(message.get("content"), str):
            return
        reply = {"role": "assistant", "content": message["content"]}
        stem = _STEM + self._hash([*self.messages, reply])
        keeper = self.keeper
        temp = keeper.store.temp_name()
        try:
            saved = await server.slot_action(self.slot, "save", temp)
        except InstanceError as exc:
            keeper.store.discard(keeper.name, temp)
            keeper._warn(exc.message)
            keeper.conversations.warnings += 1
            return
        tokens = int(saved.get("n_saved") or 0)
        key = child_key(self.model.plan)
        try:
            entry = await anyio.to_thread.run_sync(
                lambda: keeper.store.commit(
                    keeper.name, temp, slot=self.slot or 0, tokens=tokens, key=key, stem=stem
                )
            )
        except OSError as exc:
            keeper.store.discard(keeper.name, temp)
            keeper._warn(f"could not keep a conversation's state: {exc.strerror or exc}")
            return
        keeper.held[stem] = server.pid or 0
        c = keeper.conversations
        c.saves += 1
        c.saved_bytes += entry.bytes
        keeper._events.publish(
            keeper.name,
            EventKind.CONTEXT_SAVED,
            slot=self.slot,
            tokens=tokens,
            bytes=entry.bytes,
            file=entry.filename,
            conversation=True,
        )
        keeper._apply_budget()
        await keeper.refresh()


async def _idle_slot(server: Any) -> int | None:
    """The first slot not processing (``GET /slots``); None when all are busy or it cannot say."""
    slots = await server.slots()
    if isinstance(slots, list):
        for s in slots:
            if isinstance(s, dict) and not s.get("is_processing") and isinstance(s.get("id"), int):
                return int(s["id"])
    return None


def is_conversation(stem: str) -> bool:
    """A conversation's state, not a planned stop's slot save (those are restored at start)."""
    return stem.startswith(_STEM)
