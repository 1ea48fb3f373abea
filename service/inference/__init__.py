"""The engine between the HTTP front and the backend: request limits, tokenizing, explanations,
readiness and the admission of in-flight requests. Knows nothing of HTTP (no ASGI, no FastAPI)."""
