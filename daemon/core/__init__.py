"""The core: the one thread that changes what the daemon knows (core.py), the events parts post to it, the
state database only it writes (state.py), and the immutable snapshot it publishes (snapshot.py)."""
