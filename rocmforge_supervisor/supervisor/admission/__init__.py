"""Admission: who gets a model's next free slot (priority classes, fair between keys)."""
