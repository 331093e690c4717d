"""cdmpp: latency prediction for tensor programs.

The public Python API, imported lazily so that ``import cdmpp`` stays fast (TVM and torch load only when a
name that needs them is first used)::

    from cdmpp import Predictor, load_program
    predictor = Predictor.load()                      # the shipped model (or Predictor.load(url): a server)
    predictor.predict([program], "amd-epyc-znver4-2t/llvm-avx512")   # -> [Prediction(seconds, lo90, hi90, ood)]
    predictor.device("amd-epyc-znver4-2t/llvm-avx512")               # -> Device(id, kind, target, specs, ...)
"""

from __future__ import annotations

__version__ = "0.1.0"

_API = {
    "Predictor": "cdmpp.predict.predictor",
    "Prediction": "cdmpp.predict.prediction",
    "UnknownDeviceError": "cdmpp.predict.devices",
    "Device": "cdmpp.predict.devices",
    "load_program": "cdmpp.program.inputs",
    "ProgramError": "cdmpp.program.inputs",
    "Client": "cdmpp.predict.client",
    "ServiceError": "cdmpp.predict.client",
    "DeviceSpec": "cdmpp.devices.spec",
    "DeviceTable": "cdmpp.devices.table",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        import importlib

        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cdmpp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))
