"""python -m rocmforge_supervisor: the forge CLI."""

from .cli.main import main

main()
