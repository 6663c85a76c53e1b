"""Real runs that produce the same Report as an estimate, each isolated in a child process."""
