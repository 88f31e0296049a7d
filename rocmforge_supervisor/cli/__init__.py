"""The ``forge`` command line. Each ``_area.py`` module registers the commands of one area."""
