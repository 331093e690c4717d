"""The HTTP prediction service (``cdmpp serve``): FastAPI app, batch engine with a feature cache, metrics."""

from cdmpp.service.app import Settings, create_app

__all__ = ["Settings", "create_app"]
