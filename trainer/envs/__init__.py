"""Multi-turn environments: the tool-use environment (tool_use.py), its tools (tools.py) and the Python
tool's sandbox (sandbox.py) and its system-call filter (seccomp.py). docs/TOOLS.md describes the call format, the tools and the sandbox."""
