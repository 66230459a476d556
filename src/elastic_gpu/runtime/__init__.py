"""What every long-running component shares: the event loop, one logging setup, and the
health / ready / metrics HTTP plumbing."""
