"""Checks that the metrics of a cluster tell what its API tells (called by promtool.sh, after the
example jobs ran on `tessera dev`): arguments are the job list (GET /v1/jobs), a replica's
exposition and the agents' and hosts' exposition. Each check is an inequality or equality that
holds whatever the timing; exits non-zero naming the ones that fail."""

import json
import re
import sys

jobs_file, replica_file, components_file = sys.argv[1:4]
jobs = json.load(open(jobs_file))["jobs"]


def series(path):
    """(name, labels dict, value) of every sample in an exposition."""
    out = []
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$", line)
        if not m:
            sys.exit(f"figures: cannot read the sample `{line}` in {path}")
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out.append((m.group(1), labels, float(m.group(4))))
    return out


replica, components = series(replica_file), series(components_file)


def total(samples, name, **want):
    return sum(v for n, l, v in samples if n == name and all(l.get(k) == w for k, w in want.items()))


finished = [j for j in jobs if j["state"] == "finished"]
placed_once = [j for j in jobs if j.get("placed_ms")]
members_finished = sum(j["members"] for j in finished)
checks = [
    # Every member of a finished job was started by an agent and exited 0 there.
    ("agent starts >= members of finished jobs",
     total(components, "tessera_agent_task_starts_total", outcome="started"), ">=", members_finished),
    ("agent successful exits >= members of finished jobs",
     total(components, "tessera_agent_task_exits_total", outcome="succeeded"), ">=", members_finished),
    # Every job that holds or held a placement was placed by the one host (at least once).
    ("host placements >= jobs ever placed",
     total(components, "tessera_host_placements_total"), ">=", len(placed_once)),
    ("host proposals answered >= host placements",
     total(components, "tessera_host_proposals_total"), ">=", total(components, "tessera_host_placements_total")),
    # The agents' GPUs are the cluster's.
    ("agents' GPUs == the view's GPUs",
     total(components, "tessera_agent_gpus"), "==", total(replica, "tessera_gpus", use="total")),
    ("jobs placed at least once", len(placed_once), ">=", 1),
]
# Each of the host's placements is a proposal or preemption the leader accepted (or a resend of
# one): the scraped replica counts them if it has led all along (the dev cluster's first leader
# usually does; its term tells whether leadership ever changed).
leader = total(replica, "tessera_replica_role", role="leader") == 1
if leader and total(replica, "tessera_replica_term") == 1:
    checks.append(("replica accepted >= host placements",
                   total(replica, "tessera_proposals_total", outcome="accepted")
                   + total(replica, "tessera_proposals_total", outcome="already_applied"),
                   ">=", total(components, "tessera_host_placements_total")))
    checks.append(("approval latency histogram has samples",
                   total(replica, "tessera_approval_duration_seconds_count"),
                   ">=", 1))
else:
    print("figures: the scraped replica did not lead all along; its approval counts are not compared")
failed = []
for what, got, op, want in checks:
    ok = got >= want if op == ">=" else got == want
    print(f"figures: {what}: {got:g} {op} {want:g} {'ok' if ok else 'FAILED'}")
    if not ok:
        failed.append(what)
if failed:
    sys.exit(f"figures: {len(failed)} check(s) failed: {', '.join(failed)}")
