"""What the trainer, the worker and the service agree on, written once: standard library, pydantic, yaml.

- spec: the job spec (TrainSpec), validated the same way by the HTTP service, the worker and the engine;
- hyperparams, algorithms: the policy losses' parameter dataclasses and one registration per algorithm;
- catalog, verifiers: the built-in models and the verifiers' parameters a spec may name;
- protocol: the trainer process's exit codes, stdout event lines and checkpoint folder names;
- metrics: every metric key the trainer emits (unit, help, Prometheus name, where it is shown);
- safejson, storage: the document rules at every boundary and the storage fault codes;
- numbers: finite-or-None.

Nothing here imports torch, the trainer, the service, the worker or their frameworks (import-linter).
"""
