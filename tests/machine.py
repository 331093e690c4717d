"""Which kind of CPU a test runs on. Records of exact numbers (protocol_numbers*.json, shipped_sample.json,
recipe_sample.json) were made on AMD EPYC chips; on another kind the BLAS kernels differ (MKL's on an Intel chip,
its AVX-512 ones on Zen 4 against AVX2 on Zen 3), float sums come out in other orders, and a number that passes
through training moves by more than a refactor guard's tolerance. Each record names the machine it was made on
(vendor, and whether the chip has AVX-512 where the record says), and its test compares as tightly as ever on
such a machine, and looser (each test says how) on another."""

from __future__ import annotations

RECORDED_ON = "AuthenticAMD"  # the vendor of a record without a "machine" field


def _cpuinfo_first(key: str) -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(key)), None)
    except OSError:
        return None


def cpu_vendor() -> str:
    """``vendor_id`` of /proc/cpuinfo (GenuineIntel, AuthenticAMD); "unknown" where there is none."""
    return _cpuinfo_first("vendor_id") or "unknown"


def has_avx512() -> bool:
    return "avx512f" in (_cpuinfo_first("flags") or "").split()


def this_machine() -> dict:
    """What a record of exact numbers stores as its ``machine``."""
    return {"vendor": cpu_vendor(), "avx512": has_avx512()}


def same_machine(record: dict) -> bool:
    """Whether a CPU of this kind made ``record`` (its ``machine`` field, popped): the same vendor, and the same
    AVX-512 support where the record names it (older records name the vendor only)."""
    made = record.pop("machine", {"vendor": RECORDED_ON})
    return made["vendor"] == cpu_vendor() and made.get("avx512", has_avx512()) == has_avx512()
