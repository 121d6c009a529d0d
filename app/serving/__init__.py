"""An HTTP translation service: a request schema, a batcher that merges concurrent requests, the app,
and a page for people (``GET /``)."""

from app.serving.api import ServerLimits, create_app
from app.serving.batcher import Batcher
from app.serving.schema import TranslateRequest

__all__ = ["Batcher", "ServerLimits", "TranslateRequest", "create_app"]
