"""The residency rules users set: which loaded model placement may push out, and which it may not.

Four rules, each one sentence (the README says the same):

* ``pinned = true``: never unloaded to make room, by a group, or under memory pressure.
* ``swap = "never"``: never unloaded to make room or by a group (its ``ttl``, an explicit unload
  and memory pressure still may).
* ``evict_cost = N``: among idle models, the one with the highest ``idle seconds / N`` goes first.
* ``[groups.NAME]``: ``max_loaded`` members at most (the least valuable idle member makes room);
  ``exclusive`` unloads every model outside the group (except pinned and never-swap ones).

A load that the rules forbid is refused at once (:class:`~.._errors.ResidencyConflict`, 409),
naming the rule and what holds the memory; one that only waits for busy members is retried
(:class:`~.._errors.ResidencyBusy`). Pure: no clock, no process (``now`` is passed in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..._errors import ResidencyBusy, ResidencyConflict

__all__ = [
    "GroupRule",
    "Residency",
    "RuleEviction",
    "eviction_order",
    "group_evictions",
]


@dataclass(frozen=True)
class GroupRule:
    """``[groups.NAME]`` as placement reads it."""

    name: str
    members: frozenset[str]
    max_loaded: int | None = None
    exclusive: bool = False


@dataclass(frozen=True)
class Residency:
    """One model's rules (``/api/models``' ``residency``, ``forge ps``, the page)."""

    pinned: bool = False
    never_swap: bool = False
    evict_cost: float = 1.0
    group: str | None = None
    default: bool = False

    @property
    def protected(self) -> bool:
        """Placement never unloads it (to make room, or by a group's rule)."""
        return self.pinned or self.never_swap

    @property
    def rule(self) -> str:
        """The rule that protects it, as refusals name it."""
        return "pinned" if self.pinned else 'swap = "never"' if self.never_swap else "none"

    def to_json(self) -> dict[str, object]:
        return {
            "pinned": self.pinned,
            "swap": "never" if self.never_swap else "auto",
            "evict_cost": self.evict_cost,
            "group": self.group,
            "default": self.default,
        }


class _Candidate(Protocol):
    """What the rules read of a loaded model (``LoadedModel`` has these fields)."""

    @property
    def name(self) -> str: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def last_used(self) -> float: ...
    @property
    def residency(self) -> Residency: ...


M = TypeVar("M", bound=_Candidate)


@dataclass(frozen=True)
class RuleEviction:
    """A model a rule unloads, and the rule, for the ``evict`` event."""

    name: str
    rule: str


def eviction_order(idle: Sequence[M], now: float) -> list[M]:
    """Idle models, the first to go first: the highest idle seconds per unit of ``evict_cost``;
    ties by name (deterministic). Models placement must not unload are left out."""
    movable = [m for m in idle if not m.residency.protected]
    return sorted(movable, key=lambda m: (-max(0.0, now - m.last_used) / m.residency.evict_cost, m.name))


def group_evictions(
    name: str, others: Sequence[M], groups: Mapping[str, GroupRule], now: float
) -> list[tuple[M, RuleEviction]]:
    """What loading model ``name`` unloads by its group's rules, whatever the memory says.

    Raises :class:`ResidencyConflict` when pinned or never-swap members fill ``max_loaded``, and
    :class:`ResidencyBusy` when busy members do (the load waits for one to go idle)."""
    group = next((g for g in groups.values() if name in g.members), None)
    if group is None:
        return []
    out: list[tuple[M, RuleEviction]] = []
    if group.exclusive:
        rule = f"group {group.name!r} is exclusive"
        out += [
            (m, RuleEviction(m.name, rule))
            for m in others
            if m.name not in group.members and not m.residency.protected
        ]
    if group.max_loaded is not None:
        members = [m for m in others if m.name in group.members]
        excess = len(members) - group.max_loaded + 1
        if excess > 0:
            rule = f"group {group.name!r} has max_loaded = {group.max_loaded}"
            movable = eviction_order([m for m in members if m.in_flight == 0], now)
            if len(movable) < excess:
                held = [m for m in members if m.residency.protected]
                if len([m for m in members if not m.residency.protected]) < excess:
                    holders = ", ".join(f"{m.name} ({m.residency.rule})" for m in held)
                    raise ResidencyConflict(
                        f"{name} cannot be loaded: {rule} and its loaded members stay: {holders}",
                        rule=rule,
                        hint=f"unload one of them (`forge unload NAME`), or raise max_loaded of group {group.name!r}",
                    )
                busy = ", ".join(m.name for m in members if m.in_flight > 0)
                raise ResidencyBusy(
                    f"{name} waits: {rule} and its loaded members are busy ({busy})",
                    rule=rule,
                    hint="the load goes on when one of them is idle",
                )
            out += [(m, RuleEviction(m.name, rule)) for m in movable[:excess]]
    return out
