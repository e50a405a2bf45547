"""A resource manager that serves Bindery's RM contract in front of a real Slurm (issue 23).

It speaks only the contract (like ``bindery.reference_rm``) on one side and slurmrestd's
``v0.0.38`` API on the other; all its state lives in Slurm's jobs, so it can be killed and
restarted at any time. ``server.py`` has the design; ``cli.py`` runs it (``bindery rm slurm``).
"""
