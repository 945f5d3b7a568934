"""Active probing: which probe runs when (plan.py, a pure function), within whose budget, and the workers
that run fio (scheduler.py)."""
