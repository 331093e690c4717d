"""``cdmpp serve | network | bench serve/network/costmodel/tune``: the HTTP service and compiler integration."""

from __future__ import annotations

import os
import sys

from cdmpp import defaults
from cdmpp.bench.tune import DEFAULT_POPULATION
from cdmpp.cli.evaluation import _csv


def cmd_serve(args) -> int:
    """Run uvicorn with the app factory; settings travel as CDMPP_* variables, so every worker sees them."""
    import uvicorn

    if args.model:
        os.environ["CDMPP_MODEL"] = args.model
    if args.featurize_procs < 1:
        print("cdmpp serve: --featurize-procs must be at least 1 (programs are never parsed in the server "
              "process)", file=sys.stderr)
        return 2
    os.environ["CDMPP_FEATURIZE_PROCS"] = str(args.featurize_procs)
    if args.allow_tvmscript:
        os.environ["CDMPP_ALLOW_TVMSCRIPT"] = "1"
    if args.allow_origin:
        os.environ["CDMPP_ALLOW_ORIGINS"] = ",".join(filter(None, [os.environ.get("CDMPP_ALLOW_ORIGINS", ""),
                                                                   *args.allow_origin]))
    hosts = list(args.allowed_host or [])
    if args.host not in ("0.0.0.0", "::", "", "127.0.0.1", "localhost", "::1"):  # bound by name: that name too
        hosts.append(f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}")
    if hosts:
        os.environ["CDMPP_ALLOWED_HOSTS"] = ",".join(filter(None, [os.environ.get("CDMPP_ALLOWED_HOSTS", ""), *hosts]))
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            print(f"cdmpp serve: --token-env {args.token_env} is not set or empty", file=sys.stderr)
            return 2
        os.environ["CDMPP_TOKEN"] = token
    uvicorn.run("cdmpp.service.app:create_app", factory=True, host=args.host, port=args.port,
                workers=args.workers, access_log=not args.no_access_log, log_level=args.log_level)
    return 0


def cmd_bench_serve(args) -> int:
    from cdmpp.bench import serve as bench_serve

    return bench_serve.main(args)


def _add_network_args(p) -> None:
    p.add_argument("--device", default="amd-epyc-znver4-2t/llvm-avx512", help="device id (default %(default)s)")
    p.add_argument("--schedules", default="best-measured",
                   help="best-measured (the fastest stored program of each task on the device), default "
                        "(TVM's unscheduled code) or a MetaSchedule database folder (default %(default)s)")
    p.add_argument("--model", help="checkpoint folder (default: the shipped model)")
    p.add_argument("--dataset", default=defaults.DATASET, help="dataset folder of best-measured (default %(default)s)")
    p.add_argument("--task-table", default=defaults.TASK_TABLE, help="the networks' tasks (default %(default)s)")
    p.add_argument("--devices", default=defaults.DEVICES, help="device spec table (default %(default)s)")


def cmd_network(args) -> int:
    import dataclasses
    import json

    from cdmpp.devices.table import DeviceTable
    from cdmpp.predict import network as net
    from cdmpp.predict.predictor import Predictor
    from cdmpp.zoo.tasks import TaskTable

    target = DeviceTable(args.devices).get(args.device).make_target()
    if not os.path.exists(args.task_table):
        raise FileNotFoundError(f"no task table at {args.task_table} (pass --task-table PATH)")
    if args.schedules not in net.SCHEDULE_SOURCES and not os.path.isdir(args.schedules):
        raise FileNotFoundError(f"--schedules {args.schedules}: neither best-measured, default nor a MetaSchedule "
                                "database folder")
    programs = net.task_programs(args.network, TaskTable.load(args.task_table), args.schedules, args.device,
                                 args.dataset, target)
    where = args.dataset + ("" if os.path.isdir(args.dataset) else " (no such folder: pass --dataset)")
    net.check_schedules(args.network, args.device, programs, args.schedules,
                        where if args.schedules == "best-measured" else args.schedules, args.allow_default)
    p = net.predict_network(Predictor.load(args.model), args.network, args.device, programs)
    counts = net.schedule_counts(programs)
    if args.json:
        print(json.dumps({**dataclasses.asdict(p), "schedules": counts}, indent=1))
    else:
        for t in p.tasks:
            print(f"{t['weight']:3d} x {1e3 * t['seconds']:9.4f} ms  {t['source']:13s} {t['task']}")
        print(f"{p.network} on {p.device}: {1e3 * p.seconds:.3f} ms (90 % interval {1e3 * p.lo90:.3f}-"
              f"{1e3 * p.hi90:.3f} ms), {len(p.tasks)} tasks, {sum(t['weight'] for t in p.tasks)} kernel calls; "
              f"schedules: {counts['measured']} measured, {counts['tuned']} tuned, {counts['default']} default"
              + (" (untuned code summed in: --allow-default)" if counts["default"] and args.schedules != "default"
                 else ""))
    return 0


def cmd_bench_network(args) -> int:
    from cdmpp.bench import network as bench_network

    return bench_network.main(args)


def cmd_bench_costmodel(args) -> int:
    import json

    from cdmpp.bench import cost_model as bench_costmodel

    tasks = _csv(args.tasks) or bench_costmodel.DEFAULT_TASKS
    r = bench_costmodel.run(tasks, args.n, [int(t) for t in _csv(args.threads)], args.model, args.device,
                            args.dataset, args.task_table, args.seed, args.search_trials)
    print(json.dumps(r, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


def cmd_bench_tune(args) -> int:
    from cdmpp.bench import tune as bench_tune

    return bench_tune.main(args)


def add_service_commands(sub, bsub) -> None:
    sv = sub.add_parser("serve", help="serve predictions over HTTP (FastAPI + uvicorn)",
                        description="Environment: CDMPP_MODEL, CDMPP_MAX_BATCH, CDMPP_MAX_BODY_BYTES, CDMPP_TIMEOUT_S, "
                                    "CDMPP_TOKEN, CDMPP_THREADS, CDMPP_TORCH_THREADS, CDMPP_CACHE_SIZE, CDMPP_FEATURIZE_PROCS, "
                                    "CDMPP_ALLOW_TVMSCRIPT, CDMPP_ITEM_CPU_S, CDMPP_WORKER_MEM_MB, CDMPP_WORKER_USER, "
                                    "CDMPP_BODY_TIMEOUT_S, CDMPP_ALLOWED_HOSTS, CDMPP_ALLOW_ORIGINS "
                                    "(serve/README.md, with the threat model)")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--workers", type=int, default=1, help="worker processes (each loads the model; default 1)")
    sv.add_argument("--model", help="checkpoint folder (default: $CDMPP_MODEL or the shipped model)")
    sv.add_argument("--featurize-procs", type=int, default=os.cpu_count() or 1,
                    help="sandbox processes per worker that parse and featurize new programs (default: one per "
                         "CPU; at least 1: request content is never parsed in the server process)")
    sv.add_argument("--allow-tvmscript", action="store_true",
                    help="accept TVMScript text over HTTP (off by default: it is parsed by running Python, so "
                         "turn it on only when every caller is trusted); workload+trace is always accepted")
    sv.add_argument("--token-env", help="name of an environment variable holding the bearer token to require")
    sv.add_argument("--allowed-host", action="append", metavar="NAME[:PORT]",
                    help="a Host name the server answers to besides localhost and the address it is reached at "
                         "(behind a load balancer: the name clients use; '*': any, which lets DNS rebinding "
                         "through); repeatable; also CDMPP_ALLOWED_HOSTS, comma-separated")
    sv.add_argument("--allow-origin", action="append", metavar="URL",
                    help="a web origin (scheme://host[:port]) whose pages may call the server; requests with "
                         "any other Origin header are refused; repeatable; also CDMPP_ALLOW_ORIGINS")
    sv.add_argument("--no-access-log", action="store_true", help="do not log every request")
    sv.add_argument("--log-level", default="info")
    sv.set_defaults(func=cmd_serve)

    bs = bsub.add_parser("serve", help="throughput and latency of a real server under compiler-like load")
    bs.add_argument("--model", help="checkpoint folder (default: the shipped model)")
    bs.add_argument("--clients", type=int, default=16)
    bs.add_argument("--batch", type=int, default=64, help="programs per request (default 64)")
    bs.add_argument("--batches", type=int, default=160, help="requests in the mixed phase (default 160)")
    bs.add_argument("--cold-batches", type=int, default=16, help="requests in the cold phase (default 16)")
    bs.add_argument("--repeat-share", type=float, default=0.9, help="share of re-asked programs per batch (0.9)")
    bs.add_argument("--workers", type=int, default=1, help="server worker processes (default 1)")
    bs.add_argument("--threads", type=int, default=2, help="prediction threads per worker (default 2)")
    bs.add_argument("--featurize-procs", type=int, default=os.cpu_count() or 1,
                    help="featurizer processes per server worker (default: one per CPU)")
    bs.add_argument("--form", choices=["trace", "tvmscript"], default="trace",
                    help="wire form of programs: workload+trace (shared workload) or TVMScript text")
    bs.add_argument("--duration", type=float, default=120.0, help="time bound per phase in seconds (default 120)")
    bs.add_argument("--task-table", default=defaults.TASK_TABLE)
    bs.add_argument("--device", help="device id (default: the model's first llvm device)")
    bs.add_argument("--seed", type=int, default=0)
    bs.add_argument("--in-process", action="store_true",
                    help="also parse, featurize and predict the cold phase's programs in this process on one thread, "
                         "after the server stopped: the per-program cost of the wire path against it "
                         "(compare like with like: --clients 1 --featurize-procs 1)")
    bs.add_argument("--build", action="store_true",
                    help="ask as a plain request does, each new CPU program built for the model's instruction counts "
                         "(~0.3 s of a core each); default: unbuilt, as the cost model asks a tuner's candidates")
    bs.add_argument("--json", help="also write the result here")
    bs.set_defaults(func=cmd_bench_serve)

    bt = bsub.add_parser("tune", help="MetaSchedule tuning with cdmpp vs XGBoost vs random cost models")
    bt.add_argument("--model", help="checkpoint folder (default: the shipped model)")
    bt.add_argument("--trials", type=int, default=256, help="measured trials per task, cost model and seed "
                                                             "(default %(default)s)")
    bt.add_argument("--per-iter", type=int, default=16, help="trials per search iteration (default 16)")
    bt.add_argument("--cost-models", default="cdmpp,cdmpp-frozen,xgb,random",
                    help="comma-separated: cdmpp (pretrained; corrects its predictions of a task with the tuner's "
                         "measurements of it), cdmpp-finetune (fine-tunes the transformer on them instead), "
                         "cdmpp-frozen, xgb, xgb-nowarmup, random (default %(default)s)")
    bt.add_argument("--tasks", help="comma-separated network@batch/task_name (default: 5 tasks of the held-out "
                                    "networks resnet18, mobilenet_v2, bert_tiny)")
    bt.add_argument("--task-table", default=defaults.TASK_TABLE)
    bt.add_argument("--device", help="device id of this machine in the model (default: matched by mcpu and threads)")
    bt.add_argument("--threads", type=int, default=2, help="threads the tuned programs run with (default 2)")
    bt.add_argument("--seeds", default="0,1", help="comma-separated search seeds (default %(default)s)")
    bt.add_argument("--population", type=int, default=DEFAULT_POPULATION,
                    help="candidates the evolutionary search scores per generation (default: MetaSchedule's "
                         "%(default)s; smaller for a quick smoke run)")
    bt.add_argument("--out", default=defaults.REPORTS + "/tune.json")
    bt.set_defaults(func=cmd_bench_tune)

    bn = bsub.add_parser("network", help="predicted vs measured end-to-end latency of zoo networks on this machine")
    bn.add_argument("--networks", help="comma-separated network@batch (default: every network at batch 1)")
    _add_network_args(bn)
    bn.add_argument("--out", default=defaults.REPORTS + "/network.json")
    bn.set_defaults(func=cmd_bench_network)

    nw = sub.add_parser("network", help="predict a network's latency: weighted sum over its tasks' programs")
    nw.add_argument("network", help="network@batch from the task table, e.g. resnet18@1")
    _add_network_args(nw)
    nw.add_argument("--allow-default", action="store_true",
                    help="sum TVM's default (untuned) code for tasks without a measured or tuned program; "
                         "refused otherwise, as such a total mixes untuned with tuned kernels")
    nw.add_argument("--json", action="store_true", help="print the prediction with every task as JSON")
    nw.set_defaults(func=cmd_network)

    bc = bsub.add_parser("costmodel", help="programs/s of CDMPPCostModel.predict vs TVM's XGBModel on the same new "
                                           "candidates, at each tuning thread count")
    bc.add_argument("--model", help="checkpoint folder (default: the shipped model)")
    bc.add_argument("--n", type=int, default=512, help="new candidates, spread over the tasks (default 512)")
    bc.add_argument("--threads", default="1,2", help="comma-separated tuning-context thread counts (default 1,2)")
    bc.add_argument("--tasks", help="comma-separated network@batch/task_name with measured programs in the dataset "
                                    "(default: a conv2d, a dense, a softmax, a depthwise conv2d)")
    bc.add_argument("--device", default="amd-epyc-znver4-2t/llvm-avx512",
                    help="device id: its stored programs train XGBModel (default amd-epyc-znver4-2t/llvm-avx512)")
    bc.add_argument("--dataset", default=defaults.DATASET)
    bc.add_argument("--task-table", default=defaults.TASK_TABLE)
    bc.add_argument("--seed", type=int, default=0)
    bc.add_argument("--search-trials", type=int, default=64,
                    help="also replay the candidates a real search of this many trials on the first task asked "
                         "its cost model to score, repeats included (measures them; 0: skip; default 64)")
    bc.add_argument("--json", help="also write the result here")
    bc.set_defaults(func=cmd_bench_costmodel)
