# The rows of reports/study-runs.jsonl that the README's cross-device accuracy lines cite (one row per setting,
# method and seed; 3 seeds each), method names shortened to the protocol's own ("cdmpp", "cdmpp + twin"), the
# study's name kept in "study_method". random-new and cross-model come from the locked test instead
# (reports/locked-runs.jsonl, seeds 1000-1002). Build reports/summary.json from both (reports/README.md):
#   { cat reports/locked-runs.jsonl; jq -c -f reports/summary-runs.jq reports/study-runs.jsonl; } > reports/summary-runs.jsonl
#   cdmpp protocol --summarize-only --runs reports/summary-runs.jsonl --summary reports/summary.json
# cross-device-new: round 27 (the Amdahl transfer, order weight on the shots);
# cross-device-seen: round 26 (cdmpp, cdmpp + twin, the twin baselines); both cross-device settings' latency
# GBTs (with and without the transfer): round 25 (28 Nov 15:09-16:16 UTC). Rounds: reports/study-issue19.md.
select(
  (.setting == "cross-device-new" and (.method | startswith("cdmpp, 9.5 + 5 minutes, Amdahl transfer, round 27"))) or
  (.setting == "cross-device-seen" and (.method | startswith("cdmpp, 9.5 + 5 minutes, Amdahl transfer, round 26"))) or
  (.setting == "cross-device-seen" and (.method | startswith("twin-")) and .time >= "2026-11-28T18" and .time < "2026-11-28T20") or
  ((.setting | startswith("cross-device-")) and (.method | startswith("pooled GBT, latency target"))
    and .time >= "2026-11-28T15" and .time < "2026-11-28T17"))
| . + {study_method: .method}
| .method |= sub("^cdmpp, 9\\.5 \\+ 5 minutes, Amdahl transfer, round 2[67]"; "cdmpp")
