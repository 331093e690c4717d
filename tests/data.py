"""Where the tests find the checkout's data, and the real programs they borrow from it."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "datasets" / "tasks-llvm.json.gz"
DEVICES_JSON = ROOT / "datasets" / "devices.json"
LIMIT = 240  # real programs the evaluation tests load
REAL_DEVICE = "amd-epyc-znver4-1t/llvm-avx512"  # the device they come from: a fixed sample whatever is added
FAKE_DEVICE = "fake-relabeled-1t/llvm-avx2"  # NOT a real device: relabeled real programs (mechanics only)


def candidate_dirs() -> list[Path]:
    """Dataset folders to borrow real programs from: ``$CDMPP_TEST_DATASET``, else the checkout's."""
    if os.environ.get("CDMPP_TEST_DATASET"):
        return [Path(os.environ["CDMPP_TEST_DATASET"])]
    others = sorted(p for p in (ROOT / "datasets").glob("*") if p.is_dir() and p.name != "measurements")
    return [ROOT / "datasets" / "measurements", *others]
