"""On-call tools: reading dead-letter topics, replaying them, and where a group's records wait.

The command line (`redrive.cli`) and the web console present these; the runtimes never import them.
"""
