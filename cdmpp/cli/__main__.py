"""``python -m cdmpp.cli``: the same as the ``cdmpp`` command."""

import sys

from cdmpp.cli import main

sys.exit(main())
