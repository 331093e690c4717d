"""Imported once by the sandbox's forkserver: TVM loaded and the featurizer warm, so that every
sandbox worker forked from it is ready at once (``cdmpp.sandbox``)."""

from cdmpp import sandbox

sandbox.warm_up()
