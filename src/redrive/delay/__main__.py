"""`python -m redrive.delay run ...`, the same as `redrive delay run ...`."""

from redrive.delay.command import delay_command

delay_command(prog_name="python -m redrive.delay")
