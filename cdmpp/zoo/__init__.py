"""Network zoo (PyTorch definitions of real architectures) and the tuning tasks extracted from them.

Names are resolved lazily: importing ``cdmpp.zoo`` imports neither torch nor TVM, and
``python -m cdmpp.zoo.tasks`` runs without the package having imported the module first.
"""

_FROM = {
    "tasks": ["Task", "TaskTable", "build_task_table", "extract_tasks", "load_task_mod", "occurrence_key", "task_key"],
    "networks": ["NETWORKS", "NetworkSpec", "get_network"],
}
_WHERE = {name: mod for mod, names in _FROM.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"cdmpp.zoo.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'cdmpp.zoo' has no attribute {name!r}")
