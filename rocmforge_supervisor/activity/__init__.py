"""Who used what: one record per gateway request, kept in SQLite in the state dir, and the
usage sums read back from it.

The gateway fills a :class:`Record` while a request runs and hands it over once, when the
response ends or fails; :class:`ActivityStore` writes it on its own thread (batched, so the relay
never waits for the disk), keeps it by age and count, and answers the queries of
``/api/activity`` and ``/api/usage``. Nothing here knows HTTP or the supervisor.
"""

from ._assemble import assembled_text
from ._record import Record
from ._store import USAGE_GROUPS, ActivityStore, database_problem

__all__ = ["USAGE_GROUPS", "ActivityStore", "Record", "assembled_text", "database_problem"]
