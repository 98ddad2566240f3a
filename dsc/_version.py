"""dsc's version, in a module of its own that imports nothing (setup.cfg reads it; every layer may)."""
__version__ = "0.1.0"
