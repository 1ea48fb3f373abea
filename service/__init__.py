"""DiSAN inference service: FastAPI + onnxruntime with dynamic micro-batching (TORCH-FREE).

Nothing in this package may import torch: the service image installs only the `serve` extra.
`service.main.create_app(settings)` builds the app; `disan serve` (service/cli.py) runs it.

Layers (tests/repo/test_structure.py enforces them; each may import only the ones below it):

    service.main, service.cli   entry points: build the app, run `disan serve`
    service.http                the HTTP front: routes, fast path, ASGI/protocol, schemas, web page
    service.inference           the engine (limits, tokenizing, explain), admission
    service.backend             the model side: runtime, micro-batcher
    service.settings            every DISAN_* setting
    service.common              errors, timing, metrics, worker readiness, batching defaults
"""
