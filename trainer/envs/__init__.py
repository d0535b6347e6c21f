"""Multi-turn environments: the tool-use environment (tool_use.py), its tools (tools.py) and the Python
tool's sandbox (sandbox.py). docs/TOOLS.md describes the call format, the tools and the sandbox."""
