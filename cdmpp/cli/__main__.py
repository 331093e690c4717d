"""``python -m cdmpp.cli``: the same as the ``cdmpp`` command."""

import sys

from cdmpp.cli import main

if __name__ == "__main__":  # sandbox workers start by forkserver: never run a command on import
    sys.exit(main())
