"""Frontends turn a framework's model and step into a framework-neutral Trace. Each is lazy-imported."""
