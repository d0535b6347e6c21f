"""The Python client of the STARE training service (httpx, no torch) and the `stare` command."""
