"""Random valid schedules of a task, drawn from MetaSchedule's own design space.

MetaSchedule's ``ReplayTrace`` strategy replays a design-space sketch with fresh random decisions,
which is exactly "a random valid schedule". Some tasks (fused elementwise ops) have one sketch and no
decisions, so every draw is the same program: for those, ``random_loop_schedule`` adds variety with
random fuse/split/parallel/vectorize/unroll choices (on a GPU: random block and thread sizes). Duplicates
are removed by structural hash.
"""

from __future__ import annotations

import random

from cdmpp.program import tvm_env


def sample_schedules(mod, target, n: int, seed: int = 0, max_rounds: int = 4):
    """Return up to ``n`` distinct ``tvm.s_tir.Schedule``s of ``mod`` (each with its trace)."""
    tvm_env.setup()
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    seen: set[int] = set()
    out = []
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy=ms.search_strategy.ReplayTrace(), task_name="sample",
                         rand_state=seed, num_threads=1)
    spaces = ctx.generate_design_space()
    for round_ in range(max_rounds):
        want = n - len(out)
        if want <= 0:
            break
        ctx.search_strategy.pre_tuning(max_trials=want, num_trials_per_iter=want, design_spaces=spaces,
                                       database=ms.database.MemoryDatabase(), cost_model=None)
        cands = ctx.search_strategy.generate_measure_candidates() or []
        ctx.search_strategy.post_tuning()
        new = 0
        for c in cands:
            h = tvm_ffi.structural_hash(c.sch.mod)
            if h not in seen:
                seen.add(h)
                out.append(c.sch)
                new += 1
        if new == 0:
            break
    rng = random.Random(seed)
    gpu = "gpu" in [str(k) for k in target.keys]
    tries = 0
    while len(out) < n and tries < 4 * n:
        tries += 1
        sch = random_loop_schedule(mod, rng, gpu=gpu)
        if sch is None:
            break
        h = tvm_ffi.structural_hash(sch.mod)
        if h not in seen:
            seen.add(h)
            out.append(sch)
    return out[:n]


def random_loop_schedule(mod, rng: random.Random, gpu: bool = False):
    """Fuse each spatial-only block's loops, split, parallelize the outer and vectorize the inner; on a
    GPU (``gpu``), bind the split loops to blocks and threads instead.

    Returns None if the module has no block this applies to, or (GPU) a block it cannot bind: an unbound
    loop would run on the host over device memory and crash the process that runs it.
    """
    tvm_env.setup()
    from tvm.s_tir import Schedule

    sch = Schedule(mod, seed=rng.randrange(1 << 30))
    touched = False
    for block in sch.get_child_blocks(sch.get_sblock("root")) if _has_root(sch) else []:
        loops = sch.get_loops(block)
        if not loops or any(_is_reduction(sch, block)):
            if gpu:
                return None
            continue
        fused = sch.fuse(*loops)
        extent = int(sch.get(fused).extent)
        if gpu:
            _bind_random(sch, fused, extent, rng)
            touched = True
            continue
        inner = rng.choice([f for f in (1, 2, 4, 8, 16, 32, 64) if extent % f == 0])
        outer_split = rng.choice([f for f in (1, 2, 4, 8, 16, 64, 256) if (extent // inner) % f == 0])
        o, m, i = sch.split(fused, [None, extent // inner // outer_split, inner]) if outer_split > 1 else (*sch.split(fused, [None, inner]), None)[:3]
        if rng.random() < 0.8:
            sch.parallel(o)
        if i is not None and inner > 1 and rng.random() < 0.8:
            sch.vectorize(i)
        if m is not None and rng.random() < 0.5:
            sch.annotate(o, "pragma_auto_unroll_max_step", rng.choice([0, 16, 64, 512]))
            sch.annotate(o, "pragma_unroll_explicit", 1)
        touched = True
    return sch if touched else None


def _bind_random(sch, loop, extent: int, rng: random.Random) -> None:
    """Split ``loop`` into blockIdx.x x threadIdx.x (x a few serial steps per thread), random sizes."""
    threads = rng.choice([t for t in (32, 64, 128, 256, 512, 1024) if t <= extent] or [extent])
    steps = rng.choice([s for s in (1, 2, 4, 8) if threads * s <= extent] or [1])
    if steps > 1:
        bx, tx, inner = sch.split(loop, [None, threads, steps])
        if rng.random() < 0.5:
            sch.unroll(inner)
    else:
        bx, tx = sch.split(loop, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _has_root(sch) -> bool:
    try:
        sch.get_sblock("root")
        return True
    except Exception:
        return False


def _is_reduction(sch, block):
    return [int(iv.iter_type) != 0 for iv in sch.get(block).iter_vars]
