"""``cdmpp protocol`` and ``cdmpp learning-curve`` options."""


def test_protocol_runs_every_setting_and_the_learning_curve_two_by_default():
    """The two commands share their options; each has its own default settings (a shared default once
    made ``protocol`` skip the cross-device settings)."""
    from cdmpp.cli import build_parser
    from cdmpp.cli.evaluation import _protocol_options
    from cdmpp.evaluation.protocol import SETTINGS

    parse = build_parser().parse_args
    assert list(_protocol_options(parse(["protocol"])).settings) == list(SETTINGS)
    curve = parse(["learning-curve"])
    assert list(_protocol_options(curve, ("random-new", "cross-model")).settings) == ["random-new", "cross-model"]
    assert list(_protocol_options(parse(["protocol", "--settings", "cross-model"])).settings) == ["cross-model"]


def test_threads_reach_the_protocol_options():
    """``--threads`` sets each job's torch and XGBoost threads (one by default)."""
    from cdmpp.cli import build_parser
    from cdmpp.cli.evaluation import _protocol_options

    parse = build_parser().parse_args
    assert _protocol_options(parse(["protocol"])).threads == 1
    assert _protocol_options(parse(["protocol", "--threads", "2"])).threads == 2
    assert _protocol_options(parse(["learning-curve", "--threads", "2"]), ("random-new",)).threads == 2


def test_sample_chooses_among_any_programs(sampled, tmp_path, capsys):
    """`cdmpp sample --programs`: TVMScript files (not only the project's own records) are candidates; the
    chosen ones are printed by name, a file that does not parse is named and skipped."""
    from cdmpp.cli import main

    paths = []
    for name, schedules in sampled.items():
        for i, s in enumerate(schedules[:3]):
            path = tmp_path / f"{name}-{i}.tvmscript"
            path.write_text(s.mod.script())
            paths.append(str(path))
    bad = tmp_path / "bad.tvmscript"
    bad.write_text("this is not TVMScript")
    out = tmp_path / "chosen.txt"
    assert main(["sample", "--k", "4", "--programs", *paths, str(bad), "--trusted", "--out", str(out)]) == 0
    chosen = out.read_text().split()
    assert len(chosen) == len(set(chosen)) == 4 and set(chosen) <= set(paths)
    assert "bad.tvmscript" in capsys.readouterr().err
    assert main(["sample", "--k", "4"]) == 2  # neither --pool nor --programs


def test_locked_test_has_its_own_seeds_and_networks():
    """`cdmpp protocol --locked`: seeds and held-out networks no development choice has seen."""
    from cdmpp.cli import build_parser
    from cdmpp.cli.evaluation import _protocol_options
    from cdmpp.evaluation import splits
    from cdmpp.zoo.tasks import TaskTable
    from tests.data import TASKS

    opts = _protocol_options(build_parser().parse_args(["protocol", "--locked"]), ks=["0"])
    assert list(opts.seeds) == list(splits.LOCKED_SEEDS) and not set(opts.seeds) & {0, 1, 2}
    assert set(opts.held_out) == set(splits.LOCKED_HELD_OUT_NETWORKS)
    assert not set(opts.held_out) & set(splits.HELD_OUT_NETWORKS)
    assert set(splits.LOCKED_HELD_OUT_NETWORKS) <= set(TaskTable.load(str(TASKS)).networks())


def test_train_writes_a_store_and_trains_from_it_as_from_the_dataset(real, tiny_recipe, tmp_path, capsys):
    """`cdmpp train --write-store DIR` writes the split `cdmpp train` trains on; `cdmpp train --store DIR` trains
    the recipe (GBT blend and anchors on) from it to the model the dataset gives; a missing, doubled or
    conflicting store is refused with a line that says what to do."""
    import numpy as np

    from cdmpp.cli import main
    from cdmpp.model.checkpoint import TrainedModel
    from cdmpp.model.feature_store import FeatureStore
    from tests.data import DEVICES_JSON, TASKS

    folder, ds = real
    common = ["--dataset", str(folder), "--task-table", str(TASKS), "--devices", str(DEVICES_JSON), "--limit", "120",
              "--val-by", "program"]
    store = tmp_path / "store"
    assert main(["train", "--write-store", str(store), *common]) == 0
    assert f"cdmpp train --store {store}" in capsys.readouterr().out
    assert main(["train", "--write-store", str(store), *common]) == 2
    assert "already holds a store" in capsys.readouterr().err
    assert main(["train", "--recipe", tiny_recipe, "--store", str(store), "--out", str(tmp_path / "a"), *common]) == 0
    assert main(["train", "--recipe", tiny_recipe, "--out", str(tmp_path / "b"), *common]) == 0
    a, b = TrainedModel.load(tmp_path / "a"), TrainedModel.load(tmp_path / "b")
    assert a.gbt is not None and a.anchors is not None
    assert (a.summary["n_train"], a.summary["n_val"]) == (b.summary["n_train"], b.summary["n_val"])
    assert a.summary["data"]["per_device"] == b.summary["data"]["per_device"]
    val = FeatureStore(store / "val").programs()
    feats, devs = [p.features for p in val], [p.device for p in val]
    assert np.allclose(a.predict(feats, devs)[0], b.predict(feats, devs)[0], rtol=1e-5)

    assert main(["train", "--store", str(tmp_path / "none"), "--out", str(tmp_path / "c")]) == 2
    assert "no training store here" in capsys.readouterr().err
    assert main(["train", "--store", str(store), "--write-store", str(tmp_path / "d")]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_a_generated_summary_never_replaces_a_report_written_by_hand(tmp_path, capsys):
    """`cdmpp protocol --summary X.json` writes X.md; where X.md is a report someone wrote (its first line is not
    the generated one's), the summary goes beside it as X.summary.md and the report stays as it was."""
    from cdmpp.cli.evaluation import _write_generated

    hand = tmp_path / "leave-one-chip-out.md"
    hand.write_text("# Leave-one-chip-out\n\nwritten by hand\n")
    assert _write_generated(str(hand), "# cdmpp protocol summary\n\nrows\n") == str(tmp_path / "leave-one-chip-out.summary.md")
    assert hand.read_text() == "# Leave-one-chip-out\n\nwritten by hand\n"
    assert "written by hand" in capsys.readouterr().err
    generated = tmp_path / "summary.md"
    for rows in ("old", "new"):  # a generated report is rewritten in place
        assert _write_generated(str(generated), f"# cdmpp protocol summary\n\n{rows}\n") == str(generated)
    assert generated.read_text() == "# cdmpp protocol summary\n\nnew\n"
