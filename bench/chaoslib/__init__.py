"""The parts of bench/chaos.py: the processes it runs redrive's components in, the faults it
injects, and how it counts what became of every record."""
