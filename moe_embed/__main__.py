"""`python -m moe_embed SUBCOMMAND ...` is `moe-embed SUBCOMMAND ...`."""

import sys

from moe_embed.cli import main

sys.exit(main())
