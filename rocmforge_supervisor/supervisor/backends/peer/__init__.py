"""The peer backend: a model another server serves (``[peers.NAME]``, ``supervisor/_peers.py``). No
process here: never planned or placed; the gateway sends its requests to the peer."""

from ...._errors import UsageError
from ...launch._launch import LaunchPlan
from .._entry import Backend
from .._host import HostedModel, PlacementHost

__all__ = ["BACKEND"]


async def _never_planned(_host: PlacementHost, m: HostedModel) -> LaunchPlan:
    raise UsageError(f"model {m.name!r} is a peer's: it has no process to start here")


BACKEND = Backend(
    "peer",
    "a peer's model (served by another server)",
    "peer · another server",
    _never_planned,
    False,
    lambda c: frozenset(c.command_routes),
    reads_path=False,
    judges_media=True,
    remote=True,
)
