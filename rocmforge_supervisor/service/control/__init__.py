"""The control side: the control API, the status page and its static files, live events, the
status and activity APIs, /metrics, the OpenAPI description.
"""
