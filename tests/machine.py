"""Which CPU vendor a test runs on. Records of exact numbers (protocol_numbers*.json, shipped_sample.json,
recipe_sample.json) were made on AMD EPYC chips; on an Intel chip MKL takes other kernels, float sums come out
in other orders, and a number that passes through training moves by more than a refactor guard's tolerance.
Each record names the vendor it was made on, and its test compares as tightly as ever on that vendor, and
looser (each test says how) on another."""

from __future__ import annotations

RECORDED_ON = "AuthenticAMD"  # the vendor of a record without a "machine" field


def cpu_vendor() -> str:
    """``vendor_id`` of /proc/cpuinfo (GenuineIntel, AuthenticAMD); "unknown" where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "unknown")
    except OSError:
        return "unknown"


def same_vendor(record: dict) -> bool:
    """Whether this CPU's vendor made ``record`` (its ``machine`` field, popped)."""
    return record.pop("machine", {"vendor": RECORDED_ON})["vendor"] == cpu_vendor()
