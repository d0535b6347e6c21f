"""HTTP API of the training service (FastAPI). Never imports torch, transformers, accelerate or worker."""

__version__ = "0.1.0"
