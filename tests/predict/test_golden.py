"""The shipped model's answers on a fixed sample, stored before issue 57 moved prediction behind one
``Predictor`` (``golden.json``): in process (trusted, and parsed in the sandbox) and through the
service's engine, seconds and order, built and unbuilt, on a device the model trained on and one it knows from the table
alone. A refactoring that changes a number or a flag fails here.

``python -m tests.predict.test_golden`` rewrites the file (only when a new model is shipped on purpose).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdmpp.defaults import MODEL as DEFAULT_MODEL
from cdmpp.model.kinds import is_checkpoint

pytestmark = pytest.mark.skipif(not is_checkpoint(DEFAULT_MODEL), reason="no shipped model")

GOLDEN = Path(__file__).with_name("golden.json")
DEVICES = ("amd-epyc-znver4-2t/llvm-avx512", "amd-ryzen7-3700x-8t/llvm-sse2")  # trained; from its specs only


def sample_programs() -> list:
    """Four programs as a compiler sends them: the shipped TVMScript sample and three workload + trace
    items of sampled schedules (stored in ``golden.json``, so the sample does not move with the sampler)."""
    return json.loads(GOLDEN.read_text())["programs"]


def answers(predictor, engine, programs) -> dict:
    """{path: {device: [[seconds, lo90, hi90, ood, out_of_range], ...]}} through each way in."""
    rows = lambda preds: [[p.seconds, p.lo90, p.hi90, list(p.ood), list(getattr(p, "out_of_range", ()))]
                          for p in preds]
    out: dict = {}
    for d in DEVICES:
        out.setdefault("predictor", {})[d] = rows(predictor.predict(programs, d))
        out.setdefault("predictor_trusted", {})[d] = rows(predictor.predict(programs, d, trusted=True))
        out.setdefault("engine", {})[d] = rows(engine.predict(programs, d))
        out.setdefault("engine_order", {})[d] = rows(engine.predict(programs, d, order=True))
        out.setdefault("engine_cached", {})[d] = rows(engine.predict(programs, d))
        out.setdefault("engine_unbuilt", {})[d] = rows(engine.predict(programs, d, build=False))  # a tuner's way
    return out


@pytest.fixture(scope="module")
def engine(predictor):
    from cdmpp.sandbox.pool import Sandbox
    from cdmpp.service.engine import PredictEngine

    e = PredictEngine(predictor, sandbox=Sandbox(1), allow_tvmscript=True)
    yield e
    e.close()


def test_answers_are_those_stored_before(predictor, engine):
    stored = json.loads(GOLDEN.read_text())["answers"]
    got = answers(predictor, engine, sample_programs())
    assert set(got) == set(stored)
    for path, by_device in stored.items():
        for d, rows in by_device.items():
            for i, (want, have) in enumerate(zip(rows, got[path][d], strict=True)):
                assert have[0:3] == pytest.approx(want[0:3], rel=1e-5), (path, d, i)
                assert have[3:] == want[3:], (path, d, i)


def _write() -> None:  # pragma: no cover - run by hand
    from importlib import resources

    from cdmpp.measure import schedules
    from cdmpp.predict.predictor import Predictor
    from cdmpp.program import tvm_env
    from cdmpp.program.inputs import workload_trace_json
    from cdmpp.sandbox.pool import Sandbox
    from cdmpp.service.engine import PredictEngine
    from cdmpp.zoo import workloads

    tvm_env.setup(1)
    target = tvm_env.make_target("llvm", num_cores=2)
    programs: list = [(resources.files("cdmpp") / "samples" / "conv2d.tvmscript").read_text()]
    for name in ("matmul", "softmax", "layer_norm"):
        sch = schedules.sample_schedules(workloads.SAMPLES[name](), target, 2, seed=3)[1]
        programs.append(workload_trace_json(workloads.SAMPLES[name](), sch.trace))
    predictor = Predictor.load()
    engine = PredictEngine(predictor, sandbox=Sandbox(1), allow_tvmscript=True)
    try:
        GOLDEN.write_text(json.dumps({"programs": programs, "answers": answers(predictor, engine, programs)},
                                     indent=None, separators=(",", ":")) + "\n")
    finally:
        engine.close()


if __name__ == "__main__":
    _write()
