"""How cdmpp imports TVM: the popen workers TVM starts (MetaSchedule's builders and runners) run without torch."""


def _torch_in_worker() -> tuple[bool, bool]:
    import sys

    return "tvm" in sys.modules, sys.modules.get("torch") is not None


def test_tvm_popen_workers_start_without_torch():
    from cdmpp.program import tvm_env

    tvm_env.setup(1)
    from tvm.support.popen_pool import PopenPoolExecutor

    pool = PopenPoolExecutor(max_workers=1, timeout=120)
    try:
        has_tvm, has_torch = pool.submit(_torch_in_worker).result()
    finally:
        pool.shutdown()
    assert has_tvm and not has_torch  # the worker imported TVM (5 s of CPU with torch, 2 without)
