"""The residency rules in placement (pure): pinned, swap = never, evict_cost, groups.

The machine is one RX 7900 XTX (24 GiB) filled by hand, as in ``test_placement``; each case is a
plain call of :func:`place` with the loaded models' rules set.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rocmforge_supervisor._errors import PlacementError, ResidencyBusy, ResidencyConflict
from rocmforge_supervisor.supervisor.placement._placement import LoadedModel, PlacementPolicy, place
from rocmforge_supervisor.supervisor.placement._residency import GroupRule, Residency
from tests.models.conftest import LLAMA_8B, LLAMA_70B
from tests.supervisor.test_placement import loaded, one_7900xtx, req, with_used

PINNED = Residency(pinned=True)
NEVER = Residency(never_swap=True)


def _ruled(m: LoadedModel, residency: Residency) -> LoadedModel:
    return replace(m, residency=residency)


def _full(a: Residency = Residency(), b: Residency = Residency()) -> tuple[object, list[LoadedModel]]:
    """23 GiB held by a (9 GiB, used at 10) and b (9 GiB, used at 5) and a busy 5 GiB model."""
    models = [
        _ruled(loaded("a", 9, last_used=10.0), a),
        _ruled(loaded("b", 9, last_used=5.0), b),
        loaded("busy", 5, last_used=1.0, in_flight=2),
    ]
    return with_used(one_7900xtx(), {"amd:0": 23}), models


def test_a_pinned_model_is_passed_over_for_the_next_idle_one() -> None:
    inv, models = _full(b=PINNED)
    d = place(inv, req(LLAMA_8B), models, PlacementPolicy(now=20.0))  # type: ignore[arg-type]
    assert d.evict == ["a"]
    assert "evict_cost" in d.evict_rules["a"]


@pytest.mark.parametrize(("rule", "named"), [(PINNED, "pinned"), (NEVER, 'swap = "never"')])
def test_a_load_that_needs_a_kept_model_gone_is_a_conflict_naming_it_and_the_bytes(
    rule: Residency, named: str
) -> None:
    inv, models = _full(a=rule, b=rule)
    with pytest.raises(ResidencyConflict) as err:
        place(inv, req(LLAMA_8B), models, PlacementPolicy(now=20.0))  # type: ignore[arg-type]
    text = str(err.value)
    assert err.value.rule == named
    assert f"({named}, 9.0 GiB)" in text and "more on amd:0" in text and "free)" in text
    assert "forge unload" in text


def test_a_model_too_big_even_without_the_kept_ones_gets_the_memory_refusal() -> None:
    inv, models = _full(a=PINNED, b=PINNED)
    with pytest.raises(PlacementError) as err:
        place(inv, req(LLAMA_70B), models, PlacementPolicy(now=20.0))  # type: ignore[arg-type]
    assert not isinstance(err.value, ResidencyConflict)
    assert "kept by their rules: a (pinned), b (pinned)" in str(err.value)


def test_evict_cost_weights_idleness() -> None:
    # a: idle 100 s at cost 10 (score 10); b: idle 20 s at cost 1 (score 20): b goes, though a is older.
    models = [
        _ruled(loaded("a", 9, last_used=0.0), Residency(evict_cost=10)),
        _ruled(loaded("b", 9, last_used=80.0), Residency()),
    ]
    big = with_used(one_7900xtx(), {"amd:0": 23})
    assert place(big, req(LLAMA_8B), models, PlacementPolicy(now=100.0)).evict == ["b"]
    equal = [replace(m, residency=Residency()) for m in models]
    assert place(big, req(LLAMA_8B), equal, PlacementPolicy(now=100.0)).evict == ["a"]  # plain LRU


def _chat_group(**kw: object) -> dict[str, GroupRule]:
    return {"chat": GroupRule("chat", frozenset({"a", "b", "new"}), **kw)}  # type: ignore[arg-type]


def test_group_max_loaded_unloads_a_member_though_memory_fits() -> None:
    models = [loaded("a", 1, last_used=3.0), loaded("b", 1, last_used=1.0), loaded("other", 1, last_used=0.0)]
    inv = with_used(one_7900xtx(), {"amd:0": 3})
    d = place(
        inv, req(LLAMA_8B, name="new"), models, PlacementPolicy(groups=_chat_group(max_loaded=2), now=5.0)
    )
    assert d.evict == ["b"]  # the least valuable member; "other" is in no group: untouched
    assert d.evict_rules["b"] == "group 'chat' has max_loaded = 2"
    # a model in no group is in none of the rules
    free = place(inv, req(LLAMA_8B, name="solo"), models, PlacementPolicy(groups=_chat_group(max_loaded=1)))
    assert free.evict == []


def test_group_max_loaded_held_by_kept_members_is_a_conflict_and_by_busy_ones_a_wait() -> None:
    inv = with_used(one_7900xtx(), {"amd:0": 2})
    kept = [_ruled(loaded("a", 1), PINNED), _ruled(loaded("b", 1), NEVER)]
    policy = PlacementPolicy(groups=_chat_group(max_loaded=2), now=5.0)
    with pytest.raises(ResidencyConflict, match=r"a \(pinned\), b \(swap = \"never\"\)") as err:
        place(inv, req(LLAMA_8B, name="new"), kept, policy)
    assert err.value.rule == "group 'chat' has max_loaded = 2"
    busy = [loaded("a", 1, in_flight=1), loaded("b", 1, in_flight=3)]
    with pytest.raises(ResidencyBusy, match="busy"):
        place(inv, req(LLAMA_8B, name="new"), busy, policy)
    one_idle = [busy[0], loaded("b", 1)]
    assert place(inv, req(LLAMA_8B, name="new"), one_idle, policy).evict == ["b"]


def test_an_exclusive_group_unloads_every_outsider_but_the_kept_ones() -> None:
    models = [
        loaded("a", 1),
        loaded("x", 1, in_flight=2),  # busy: drained by the unload, still unloaded
        loaded("y", 1),
        _ruled(loaded("p", 1), PINNED),
        _ruled(loaded("n", 1), NEVER),
    ]
    inv = with_used(one_7900xtx(), {"amd:0": 5})
    d = place(inv, req(LLAMA_8B, name="new"), models, PlacementPolicy(groups=_chat_group(exclusive=True)))
    assert sorted(d.evict) == ["x", "y"]
    assert d.evict_rules["x"] == "group 'chat' is exclusive"


def test_rules_that_would_unload_are_refused_when_eviction_is_off() -> None:
    """The warm default's start never unloads anything to get in."""
    models = [loaded("a", 1)]
    inv = with_used(one_7900xtx(), {"amd:0": 1})
    policy = PlacementPolicy(allow_evict=False, groups=_chat_group(max_loaded=1))
    with pytest.raises(PlacementError, match="would unload a"):
        place(inv, req(LLAMA_8B, name="new"), models, policy)
