"""The HTTP front: FastAPI routes and the raw-ASGI fast path, the request/response schemas, the
handlers both share, the httptools protocol and the playground page (web/)."""
