# The rows of reports/study-runs.jsonl that the README's accuracy lines cite (one row per setting, method and
# seed; 3 seeds each), method names shortened to the protocol's own ("cdmpp", "cdmpp + twin"), the study's
# name kept in "study_method". Build reports/summary.json from them (reports/README.md):
#   jq -c -f reports/summary-runs.jq reports/study-runs.jsonl > reports/summary-runs.jsonl
#   cdmpp protocol --summarize-only --runs reports/summary-runs.jsonl --summary reports/summary.json
# random-new: round 27 (its MAPE equals round 22's; ranked by the order prediction) and round 22's MAPE-loss GBT;
# cross-model: round 21 (cdmpp, 05:27-06:06 UTC) and round 22 (the GBT); cross-device-new: round 27 (the Amdahl transfer, order weight on the shots);
# cross-device-seen: round 26 (cdmpp, cdmpp + twin, the twin baselines); both cross-device settings' latency
# GBTs (with and without the transfer): round 25 (28 Nov 15:09-16:16 UTC). Rounds: reports/study-issue19.md.
select(
  (.setting == "random-new" and (.method == "cdmpp, 9.5 + 5 minutes, round 27"
                                 or (.method == "pooled GBT, MAPE loss" and .time >= "2026-11-28"))) or
  (.setting == "cross-model" and .time >= "2026-11-28" and (.method == "cdmpp, 9.5 + 5 minutes, two blend weights"
                                                              or .method == "pooled GBT, MAPE loss")) or
  (.setting == "cross-device-new" and (.method | startswith("cdmpp, 9.5 + 5 minutes, Amdahl transfer, round 27"))) or
  (.setting == "cross-device-seen" and (.method | startswith("cdmpp, 9.5 + 5 minutes, Amdahl transfer, round 26"))) or
  (.setting == "cross-device-seen" and (.method | startswith("twin-")) and .time >= "2026-11-28T18" and .time < "2026-11-28T20") or
  ((.setting | startswith("cross-device-")) and (.method | startswith("pooled GBT, latency target"))
    and .time >= "2026-11-28T15" and .time < "2026-11-28T17"))
| . + {study_method: .method}
| .method |= sub("^cdmpp, 9\\.5 \\+ 5 minutes(, two blend weights|, round 27|, Amdahl transfer, round 2[67])"; "cdmpp")
