"""`python -m stare_client.cli`: the same as the `stare` command."""

import sys

from stare_client.cli import main

sys.exit(main())
