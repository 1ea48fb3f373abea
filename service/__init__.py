"""DiSAN inference service: FastAPI + onnxruntime with dynamic micro-batching (TORCH-FREE).

Nothing in this package may import torch: the service image installs only the `serve` extra.
`service.main.create_app(settings)` builds the app; `disan serve` (service/cli.py) runs it.
"""
