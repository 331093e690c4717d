"""``cdmpp featurize | collect``: options, defaults and messages."""

import subprocess
import sys

import pytest


def test_cli_keeps_artifacts_beside_the_feature_cache_unless_told(tmp_path, monkeypatch):
    from cdmpp.cli import build_parser
    from cdmpp.cli.measure import _artifact_dir

    monkeypatch.setenv("CDMPP_CACHE", str(tmp_path / "cache"))
    parse = build_parser().parse_args
    assert _artifact_dir(parse(["remeasure", "--device", "d"])) == str(tmp_path / "cache" / "artifacts")
    assert _artifact_dir(parse(["collect", "--artifacts", "/x"])) == "/x"
    assert _artifact_dir(parse(["noise", "--device", "d", "--artifacts", "none"])) is None


def test_collect_help_shows_the_guard_defaults():
    from cdmpp.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    for cmd in ("collect", "remeasure", "noise"):
        text = sub[cmd].format_help()
        assert "--quiet-share" in text and "(default 0.05)" in text.replace("\n", " ").replace("  ", " ")
        assert "--max-wait-minutes" in text and "default 30.0" in " ".join(text.split())
    assert "--tasks-like" in sub["collect"].format_help() and "--programs-from" in sub["collect"].format_help()


def test_collect_for_cuda_without_a_gpu_says_so(capsys):
    from cdmpp.program import tvm_env

    if tvm_env.setup().cuda(0).exist:
        pytest.skip("this machine has a GPU")
    from cdmpp.cli import main

    assert main(["collect", "--target", "cuda", "--tasks", "no-such-task-name", "--per-task", "1"]) == 2
    assert "no task matches" in capsys.readouterr().err
    assert main(["collect", "--target", "cuda", "--tasks-like", "softmax", "--per-task", "1"]) == 2
    assert "no CUDA GPU visible to TVM" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_featurize_prints_the_compact_ast_of_the_shipped_sample():
    out = subprocess.run([sys.executable, "-m", "cdmpp.cli", "featurize"], check=True, capture_output=True, text=True)
    assert "3 leaves" in out.stdout and "store conv2d_nchw" in out.stdout


def test_data_counts_each_devices_labels_search_candidates_and_twins(tmp_path, capsys):
    import json

    from cdmpp.cli import main
    from cdmpp.records.store import RecordStore

    def rec(dev, h, seconds=(1e-3,), **kw):
        return {"id": f"{dev}|t|{h}", "device": dev, "task": "t", "program_hash": h, "networks": ["resnet18@1"],
                "seconds": list(seconds), "error": None, "disturbed": False, **kw}

    store = RecordStore(str(tmp_path))
    store.append("a/llvm", [rec("a/llvm", "p0"), rec("a/llvm", "p1", search={"trial": 0}), rec("a/llvm", "p2"),
                            rec("a/llvm", "p3", seconds=(), error="build failed"),
                            rec("a/llvm", "p4", disturbed=True)])
    store.append("b/llvm", [rec("b/llvm", "p0"), rec("b/llvm", "p1")])
    assert main(["data", "--dataset", str(tmp_path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["devices"]
    assert got["a/llvm"] == {"programs": 3, "search_candidates": 1, "twins": 2, "failed": 1, "disturbed": 1,
                             "tasks": 1, "networks": {"resnet18": 3}}
    assert (got["b/llvm"]["programs"], got["b/llvm"]["twins"], got["b/llvm"]["search_candidates"]) == (2, 2, 0)
    assert main(["data", "--dataset", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "5 labelled programs on 2 devices" in table and table.splitlines()[1].split()[:4] == ["a/llvm", "3", "1", "2"]
    assert main(["data", "--dataset", str(tmp_path / "nothing")]) == 2
    assert "no dataset folder" in capsys.readouterr().err
