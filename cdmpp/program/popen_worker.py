"""TVM's popen worker (MetaSchedule's builders and runners) started without torch.

``tvm.exec.popen_worker`` imports TVM, and tvm_ffi imports torch whenever it can: 5 s of CPU per worker
instead of 2, and each build call of MetaSchedule's ``LocalBuilder`` starts new workers. The workers build and
run TVM code only. ``tvm_env.setup`` makes TVM start its workers through this module.
"""

if __name__ == "__main__":
    from cdmpp.program.tvm_env import keep_torch_out

    keep_torch_out()
    from tvm.exec.popen_worker import main

    main()
