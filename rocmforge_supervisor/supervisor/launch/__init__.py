"""The launch pipeline, written once: model spec, resolve, inspect, place, launch plan."""
