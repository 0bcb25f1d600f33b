"""`python -m redrive ...`, the same as the `redrive` command."""

from redrive.cli import main

main()
