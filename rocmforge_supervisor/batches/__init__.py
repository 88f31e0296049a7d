"""The OpenAI Batch API's storage and runner (``/v1/files``, ``/v1/batches``).

``_store``: files and batches in ``<state_dir>/batches`` (SQLite records, 0600 body files), each
line's answer recorded as it comes; ``_runner``: the task that sends the lines through the
service's own request path in the ``background`` class. The routes are the service's
(``service.proxy._batch_api``); nothing here knows HTTP.
"""

from ._runner import BatchRunner, Send
from ._store import ENDPOINTS, WINDOWS, BatchStore, Line, parse_input

__all__ = ["ENDPOINTS", "WINDOWS", "BatchRunner", "BatchStore", "Line", "Send", "parse_input"]
