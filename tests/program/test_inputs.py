"""Program input forms: every form gives the same program; bad input says what is wrong."""

import json

import numpy as np
import pytest

from cdmpp.program.features import featurize
from cdmpp.program.inputs import ProgramError, load_program, workload_trace_json


def test_all_input_forms_agree(sampled, cpu_target):
    from cdmpp.zoo import workloads

    sch = sampled["matmul"][1]
    ref = featurize(sch.mod, cpu_target)
    as_func = featurize(sch.mod["main"], cpu_target)
    as_text = featurize(sch.mod.script(), cpu_target)
    record = workload_trace_json(workloads.matmul(), sch.trace)
    as_record = featurize(json.dumps(record), cpu_target)
    as_dict = featurize(record, cpu_target)
    for other in (as_func, as_text, as_record, as_dict):
        assert other.program_hash == ref.program_hash
        assert np.array_equal(other.leaf_features, ref.leaf_features)


@pytest.mark.parametrize("bad, target, match", [
    ("def main(:\n  pass", "llvm", "TVMScript does not parse"),
    ("", "llvm", "empty TVMScript"),
    ("{not json", "llvm", "does not parse"),
    ({"workload": "garbage"}, "llvm", "lacks"),
    ({"workload": "garbage", "trace": []}, "llvm", "workload does not load"),
    (42, "llvm", "unsupported program type"),
    (None, "opencl", "unknown target"),
])
def test_malformed_input_raises_program_error(tvm, bad, target, match):
    from cdmpp.zoo import workloads

    program = workloads.matmul() if bad is None else bad
    with pytest.raises(ProgramError, match=match):
        featurize(program, target)


def test_module_without_primfunc_is_rejected(tvm):
    with pytest.raises(ProgramError, match="exactly one PrimFunc"):
        load_program(tvm.IRModule({}))


def test_trace_that_does_not_fit_its_workload(sampled):
    from cdmpp.zoo import workloads

    record = workload_trace_json(workloads.softmax(), sampled["matmul"][0].trace)
    with pytest.raises(ProgramError, match="trace does not apply"):
        load_program(record)
