"""``forge doctor``: checks every layer below it (hardware, the build, the process environment).

A package of its own, above binaries/, process/ and hardware/, because it uses all three; inside
hardware/ it made hardware reach up into the layers that depend on it.
"""

from ._doctor import Check, DoctorReport, compare_listing, load_target, run_doctor

__all__ = ["Check", "DoctorReport", "compare_listing", "load_target", "run_doctor"]
