"""``CDMPPCostModel`` inside MetaSchedule, in process and over HTTP."""

import tempfile

import numpy as np
import pytest

from cdmpp.defaults import MODEL as DEFAULT_MODEL
from cdmpp.model.kinds import is_checkpoint

pytestmark = pytest.mark.skipif(not is_checkpoint(DEFAULT_MODEL),
                                reason=f"no shipped model at {DEFAULT_MODEL} yet")


def _candidates(target, n=12):
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.zoo import workloads

    ctx = ms.TuneContext(mod=workloads.matmul(), target=target, space_generator="post-order-apply",
                         search_strategy=ms.search_strategy.ReplayTrace(), task_name="t", rand_state=1, num_threads=1)
    ctx.search_strategy.pre_tuning(max_trials=n, num_trials_per_iter=n, design_spaces=ctx.generate_design_space(),
                                   database=ms.database.MemoryDatabase(), cost_model=None)
    cands = ctx.search_strategy.generate_measure_candidates()
    ctx.search_strategy.post_tuning()
    return ctx, list(cands)


@pytest.mark.slow
def test_tune_tir_with_cdmpp_cost_model(tvm, predictor, device, restore_logging):
    """8 measured trials of a small matmul: the search asks cdmpp, the results come back, one fine-tune runs."""
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.bench.tune import unnamed_handlers_aside
    from cdmpp.predict.cost_model import CDMPPCostModel
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    target = tvm_env.make_target("llvm", num_cores=1)
    cm = CDMPPCostModel(predictor=predictor, device=device, online_finetune=True, finetune_every=4, finetune_steps=3)
    base = predictor.model
    with tempfile.TemporaryDirectory() as work_dir, unnamed_handlers_aside():
        db = ms.tune_tir(
            workloads.matmul(64, 64, 64), target, work_dir, max_trials_global=8, num_trials_per_iter=8,
            builder=ms.builder.LocalBuilder(max_workers=1, initializer=tvm_env.worker_initializer),
            runner=ms.runner.LocalRunner(initializer=tvm_env.worker_initializer,
                                         evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1)),
            database=ms.database.MemoryDatabase(), cost_model=cm, num_tuning_cores=1,
            strategy=ms.search_strategy.EvolutionarySearch(population_size=32, init_min_unmeasured=16,
                                                           genetic_num_iters=1))
        records = db.get_all_tuning_records()
    assert len(records) == 8
    assert cm.n_predict_calls >= 1 and cm.n_predicted >= 8
    assert cm.n_results + cm.n_failed_results == 8 and cm.n_results >= 4
    assert len(cm.buffer_) == cm.n_results and all(s.seconds > 0 for s in cm.buffer_)
    assert cm.n_finetunes >= 1 and cm.model_ is not None
    assert predictor.model is base  # the caller's predictor is left as it was


@pytest.mark.slow
def test_scores_in_process_and_over_http_agree(tvm, predictor, device):
    """Remote scoring (traces over one shared workload) gives the in-process scores; higher = faster."""
    from cdmpp.predict.cost_model import CDMPPCostModel
    from cdmpp.program import tvm_env
    from cdmpp.service.app import Settings, create_app
    from cdmpp.service.background import BackgroundServer

    ctx, cands = _candidates(tvm_env.make_target("llvm", num_cores=2))
    local = CDMPPCostModel(predictor=predictor, device=device)
    scores = local.predict(ctx, cands)
    assert scores.dtype == np.float64 and scores.shape == (len(cands),)
    assert (scores > 0).all() and np.isclose(scores.max(), 1.0)
    seconds = np.array([p.seconds for p in predictor.predict([c.sch.mod for c in cands], device, order=True,
                                                             build=False)])  # a tuner's candidates go unbuilt
    np.testing.assert_allclose(scores, seconds.min() / seconds, rtol=1e-5)
    with BackgroundServer(create_app(Settings(), predictor)) as url:
        remote = CDMPPCostModel(url=url, device=device)
        np.testing.assert_allclose(remote.predict(ctx, cands), scores, rtol=1e-4)
        assert not remote.online_finetune


def test_candidates_score_as_their_programs_do(tvm, predictor, device):
    """The tuner path (features straight from MeasureCandidates, on the context's threads, in chunks
    scored in parallel when it has several) gives the same latencies as predicting the candidates'
    modules through the Predictor."""
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.bench.cost_model import _candidates
    from cdmpp.predict.cost_model import CDMPPCostModel
    from cdmpp.program import tvm_env
    from cdmpp.zoo import workloads

    mod = workloads.matmul(64, 64, 64)
    target = tvm_env.make_target("llvm", num_cores=2)
    cands = _candidates(mod, target, 24, seed=1)
    cm = CDMPPCostModel(predictor=predictor, device=device, online_finetune=False)
    via_programs = np.array([p.seconds for p in predictor.predict([c.sch.mod for c in cands], device, order=True,
                                                                  build=False)])  # a tuner's candidates go unbuilt
    for threads in (1, 2):  # 2: chunks featurized and scored on two threads at once
        context = ms.TuneContext(mod, target=target, num_threads=threads)
        np.testing.assert_allclose(cm._local(context, cands, device, "t"), via_programs, rtol=1e-5)
        np.testing.assert_allclose(cm._local(context, cands[:6], device, "t"), via_programs[:6], rtol=1e-5)


def test_measurements_correct_the_predictions_of_their_task(tvm, predictor, device):
    """Once a task has ``min_correct`` measurements, its predictions follow them: a task measured 3x
    slower than predicted is then predicted 3x slower (and scored the same order)."""
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.predict.cost_model import CDMPPCostModel, _task_id
    from cdmpp.program import tvm_env

    context, cands = _candidates(tvm_env.make_target("llvm", num_cores=1), n=24)
    cm = CDMPPCostModel(predictor=predictor, device=device, online_finetune=False, min_correct=16)
    task = _task_id(context.mod)
    before = cm._local(context, cands, device, task)
    cm.update(context, cands[:8], [ms.runner.RunnerResult(run_secs=[3.0 * s], error_msg=None) for s in before[:8]])
    assert task not in cm.corrections_  # too few measurements yet
    cm.update(context, cands[8:], [ms.runner.RunnerResult(run_secs=[3.0 * s], error_msg=None) for s in before[8:]])
    after = cm._local(context, cands, device, task)
    np.testing.assert_allclose(after / before, 3.0, rtol=0.05)
    assert np.array_equal(np.argsort(after), np.argsort(before))
    assert cm._local(context, cands, device, "another task").tolist() == before.tolist()
    assert set(cm.predicted_) == {(b.features.program_hash, device) for b in cm.buffer_}  # each predicted once


def test_a_candidate_scored_again_is_not_featurized_again(tvm, predictor, device):
    """An evolutionary search scores many candidates twice: the second time their features come from
    the cache (keyed by structural hash), whatever the context's threads, and the score is the same."""
    from tvm.s_tir import meta_schedule as ms

    from cdmpp.predict.cost_model import CDMPPCostModel
    from cdmpp.predict.predictor import Predictor
    from cdmpp.program import tvm_env

    context, cands = _candidates(tvm_env.make_target("llvm", num_cores=1), n=16)
    fresh = Predictor(predictor.model)  # its own feature cache: the session's has seen these candidates
    cm = CDMPPCostModel(predictor=fresh, device=device, online_finetune=False)
    first = cm._local(context, cands[:10], device, "t")
    extracted = []
    extract = fresh.features._extract
    fresh.features._extract = lambda ctx, cs: extracted.extend(cs) or extract(ctx, cs)
    again = cm._local(context, cands[4:], device, "t")
    assert extracted == cands[10:]  # only the six never seen
    # the same features; the score may differ in float32 rounding, since the batch around it differs
    np.testing.assert_allclose(again[:6], first[4:], rtol=1e-6)
    hashes = {f.program_hash for f in fresh.featurize_candidates(context, cands)}
    assert all(hashes) and len(hashes) == len(fresh.features)
    # on two threads, the workers featurizing chunks look in the same cache
    extracted.clear()
    two = ms.TuneContext(context.mod, target=context.target, num_threads=2)
    np.testing.assert_allclose(cm._local(two, cands, device, "t"), cm._local(context, cands, device, "t"), rtol=1e-6)
    assert extracted == []


def test_device_matching_falls_back_to_a_kindred_cpu_with_a_warning(tvm):
    from cdmpp.predict.cost_model import _match_device

    devices = {"zen4-1t": {"kind": "llvm", "mcpu": "znver4", "num-cores": 1},
               "zen4-2t": {"kind": "llvm", "mcpu": "znver4", "num-cores": 2},
               "h100": {"kind": "cuda", "arch": "sm_90"}}
    assert _match_device(devices, tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})) == "zen4-2t"
    with pytest.warns(UserWarning, match="scoring as zen4-1t"):
        assert _match_device(devices, tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 1})) == "zen4-1t"
    with pytest.raises(ValueError, match="pass device= one of"):
        _match_device(devices, tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 16}))
