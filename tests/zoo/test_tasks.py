"""Tuning tasks from networks: weights, deduplication, the task table."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from cdmpp.zoo import networks as zn
from cdmpp.zoo import tasks as zt


class _TinyA(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = zn.conv_bn(3, 16, 3)
        self.body = nn.Sequential(zn.conv_bn(16, 16, 3), zn.conv_bn(16, 16, 3))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.body(self.stem(x)), 1), 1))


class _TinyB(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = zn.conv_bn(3, 16, 3)  # same kernel as _TinyA's stem → same task key
        self.body = zn.conv_bn(16, 32, 3, stride=2)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.body(self.stem(x)), 1), 1))


_IMG = (((3, 16, 16), "float32"),)


@pytest.fixture(scope="module")
def extracted():
    """Extract the three test networks once (≈ 10 s) with the test specs patched into the registry."""
    from cdmpp.program import tvm_env

    extra = {
        "t_a": zn.NetworkSpec("t_a", _TinyA, _IMG),
        "t_b": zn.NetworkSpec("t_b", _TinyB, _IMG),
        "t_bert": zn.NetworkSpec("t_bert", zn.bert_tiny, (((16,), "int64"),)),
    }
    saved = dict(zn.NETWORKS)
    zn.NETWORKS.update(extra)
    try:
        tvm_env.setup()
        target = tvm_env.make_target("llvm", num_cores=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            table, calls = zt.TaskTable(), {}
            for n in extra:  # what build_task_table does, keeping each module to count its kernel calls
                mod = zt.network_to_relax(n, 1)
                calls[n] = zt.count_tir_calls(mod)
                table.add(zt.extract_tasks(n, 1, target, mod=mod))
            small = zt.build_task_table(["t_a"], [1], target, progress=False)
    finally:
        zn.NETWORKS.clear()
        zn.NETWORKS.update(saved)
    assert set(small.tasks) == set(table.filter(networks=["t_a"]).tasks)
    return table, calls


def test_tasks_match_exact_names_and_tasks_like_substrings():
    from cdmpp.zoo.tasks import Task, TaskTable

    table = TaskTable()
    table.add([Task("k1", "conv2d", "{}", None, {"n@1": 1}), Task("k2", "fused_conv2d_add", "{}", None, {"n@1": 1}),
               Task("k3", "softmax", "{}", None, {"n@1": 1})])
    assert set(table.filter(task_names=["conv2d"]).tasks) == {"k1"}
    assert set(table.filter(task_like=["conv2d"]).tasks) == {"k1", "k2"}
    assert set(table.filter(task_keys=["k3"]).tasks) == {"k3"}


def test_weights_count_every_kernel_call(extracted):
    table, calls = extracted
    for net, n in calls.items():
        pairs = table.tasks_of(net)
        assert pairs and sum(w for _, w in pairs) == n
        assert len({t.key for t, _ in pairs}) == len(pairs)
    summary = table.summary()
    assert summary["t_a@1"]["calls"] == calls["t_a"]


def test_dedup_across_networks(extracted):
    table, _ = extracted
    shared = [t for t in table if {"t_a", "t_b"} <= t.networks]
    assert shared, "the shared conv stem must be one task"
    assert any("conv2d" in t.name for t in shared)
    # the table holds each key once, and the shared task carries both networks' weights
    assert len(table.tasks) == len({t.key for t in table})
    n_a, n_b = len(table.tasks_of("t_a")), len(table.tasks_of("t_b"))
    assert len(table.filter(networks=["t_a", "t_b"])) < n_a + n_b
    # conv nets and BERT share nothing here, and filtering keeps only their tasks
    bert = table.filter(networks=["t_bert"])
    assert len(bert) == len(table.tasks_of("t_bert")) and all(t.networks == {"t_bert"} for t in bert)
    assert all("softmax" in t.name for t in table.filter(task_like=["softmax"]))


def test_save_load_roundtrip_and_stable_keys(extracted, tmp_path):
    table, _ = extracted
    for fname in ["tasks.json", "tasks.json.gz"]:
        path = tmp_path / fname
        table.save(str(path))
        back = zt.TaskTable.load(str(path))
        assert set(back.tasks) == set(table.tasks)
        for key, t in back.tasks.items():
            assert t.occurrences == table[key].occurrences and t.name == table[key].name
    # keys are recomputed identically from the stored JSON, here and in a fresh process
    some = sorted(back, key=lambda t: t.key)[:3]
    assert all(zt.task_key(zt.load_task_mod(t)) == t.key for t in some)
    code = ("import sys; from cdmpp.zoo import tasks as zt; t = zt.TaskTable.load(sys.argv[1]);"
            "print(' '.join(zt.task_key(zt.load_task_mod(t[k])) for k in sys.argv[2:]))")
    out = subprocess.run([sys.executable, "-c", code, str(path), *[t.key for t in some]],
                         capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2]).stdout.split()
    assert out == [t.key for t in some]
