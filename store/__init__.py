"""The SQL that the API (service/) and the workers (worker/) share: models, the repository of every read and
write, the engines and pools, migrations, and the settings both sides need. It imports neither the service
nor the worker, and no web framework or torch (import-linter contracts in pyproject.toml)."""
