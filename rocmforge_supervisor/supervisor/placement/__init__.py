"""Placement, pure: estimates and the machine's memory in, a decision (or a refusal with its advice) out; the plan of a whole config; yielding memory to other programs."""
