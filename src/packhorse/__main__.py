"""``python -m packhorse`` runs the command line."""

from packhorse.cli import main

main()
