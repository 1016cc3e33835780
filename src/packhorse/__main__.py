"""``python -m packhorse`` runs the command line."""

from .cli import main

main()
