"""Sources: the parts that read the machine on threads of their own and post what they read to the core
(diskstats, settings, XFS, SMART, uevents, discovery). Each is registered once, in sources/registry.py."""
