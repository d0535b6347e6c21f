"""Multi-turn environments: the tool-use environment (tool_use.py), its tools (tools.py) and the Python
tool's sandbox (sandbox.py; what it binds for the interpreter in sandbox_runtime.py, the parent's hold on its
processes in sandbox_processes.py) and its system-call filter (seccomp.py). docs/TOOLS.md describes the call format, the tools and the sandbox."""
