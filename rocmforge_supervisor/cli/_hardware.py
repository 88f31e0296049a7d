"""CLI commands of this area (filled in by the area's work)."""

from __future__ import annotations

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app``."""
