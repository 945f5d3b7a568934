"""Passive detection: every disk judged on the load it carries, against its own curve and its peers.
detector.py is pure policy; part.py feeds it windows; replay.py runs it over recorded traces."""
