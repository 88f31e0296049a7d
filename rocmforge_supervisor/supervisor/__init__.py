"""Supervision: in-process loads, placement, and the multi-model supervisor behind `forge serve`."""

from ._local import LoadOptions, LocalModel, aload_model, load_model, plan_local_load

__all__ = ["LoadOptions", "LocalModel", "aload_model", "load_model", "plan_local_load"]
