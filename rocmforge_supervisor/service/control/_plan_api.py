"""``GET /api/plan``: the running config placed on this machine's devices now, beside what is
loaded — ``forge plan``'s answer from the service itself (nothing is started or unloaded).

A key scoped to some models gets their rows only, and no other model's name anywhere in the
answer (what a row would unload, which models cannot be loaded together, the texts): the same
:class:`~..core._visibility.ModelScope` filter as ``/api/models``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..._errors import ForgeError
from ..core._state import request_id, state_of
from ..core._visibility import model_scope
from ..edge._errors_http import error_response

__all__ = ["routes"]


def routes() -> list[BaseRoute]:
    return [Route("/api/plan", api_plan, methods=["GET"])]


async def api_plan(request: Request) -> Response:
    """
    summary: Where each configured model would go now, and which cannot be loaded together.
    description: Per model its devices, memory estimate by part, the context ctx_size = "auto"
      would choose and what its load would unload, beside what is loaded now; for one that fits
      nowhere, the changes that would make it fit. Nothing is started or unloaded.
    responses:
      200: {description: "{start_from, devices, loaded, models: [{name, state, devices, estimate,
        ctx_size, context, evict, error, hint, fits_alone, advice}], cannot_load_together} — a
        non-admin key's models only"}
    """
    st = state_of(request)
    try:
        plan = await st.supervisor.plan()
    except ForgeError as exc:
        return error_response(exc, request_id(request))
    seen = model_scope(request.scope, st.supervisor)
    body: dict[str, Any] = plan.to_json()
    if not seen.everything:
        body["models"] = [m for m in body["models"] if seen.sees(str(m["name"]))]
        body["loaded"] = [n for n in body["loaded"] if seen.sees(str(n))]
        body["cannot_load_together"] = [
            t for t in body["cannot_load_together"] if any(seen.sees(str(n)) for n in t["models"])
        ]
        body = seen.filtered(body)
    return JSONResponse(body)
