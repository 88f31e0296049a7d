"""The Ollama dialect: Ollama's ``/api/*`` routes, translated to and from the core's forwarder.

It depends one way on the core (``service/``'s model facts, forwarder, error map); the core never
imports it, except the app that mounts its routes (an import-linter contract keeps it so).
"""

from ._api import OLLAMA_COMPAT_VERSION, OllamaAdapter, OllamaBackend, routes

__all__ = ["OLLAMA_COMPAT_VERSION", "OllamaAdapter", "OllamaBackend", "routes"]
