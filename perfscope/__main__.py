"""``python -m perfscope`` runs the CLI."""

import sys

from perfscope.cli import main

sys.exit(main())
