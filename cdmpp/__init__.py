"""cdmpp: latency prediction for tensor programs."""

__version__ = "0.1.0"
