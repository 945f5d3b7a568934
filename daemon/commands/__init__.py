"""Commands that run beside the daemon, not in it: status, baseline and ack, characterize."""
