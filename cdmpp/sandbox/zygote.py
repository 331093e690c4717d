"""Imported once by the sandbox's forkserver: TVM loaded, the targets of ``CDMPP_SANDBOX_KINDS`` built and
the featurizer warm, so that every sandbox worker forked from it is ready at once (``cdmpp.sandbox.pool``)."""

import os

from cdmpp.sandbox import worker

worker.warm_up(os.environ.get("CDMPP_SANDBOX_KINDS", "llvm").split(","))
