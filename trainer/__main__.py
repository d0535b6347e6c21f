"""`python -m trainer ...`: the command line of trainer/launch/cli.py."""

import sys

from trainer.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
