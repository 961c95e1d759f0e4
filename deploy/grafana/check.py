"""Checks a Grafana dashboard against a real /metrics exposition (called by promtool.sh):
every panel has a PromQL expression, each expression parses (promtool check rules, on a rules
file made of them), and every tessera_* metric it names is in the exposition. Exits non-zero,
naming the panel, otherwise."""

import json
import re
import subprocess
import sys
import tempfile

dashboard, metrics = sys.argv[1], sys.argv[2]
doc = json.load(open(dashboard))
exposed = set()
for line in open(metrics):
    if line and not line.startswith("#"):
        exposed.add(re.split(r"[{\s]", line, maxsplit=1)[0])
rules, failures = [], []
for panel in doc["panels"]:
    targets = panel.get("targets") or []
    if not targets:
        failures.append(f"panel `{panel['title']}`: no query")
    for t in targets:
        expr = t["expr"]
        rules.append(expr)
        for name in set(re.findall(r"\btessera_[a-z_]+", expr)):
            if name not in exposed:
                failures.append(f"panel `{panel['title']}`: `{name}` is not in the exposition")
with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
    f.write("groups:\n  - name: grafana-panels\n    rules:\n")
    for i, expr in enumerate(rules):
        f.write(f"      - record: tessera:panel_query_{i}\n        expr: {json.dumps(expr)}\n")
r = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
if r.returncode != 0:
    failures.append(f"PromQL: {r.stdout}{r.stderr}")
if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
print(f"grafana: {len(doc['panels'])} panels, {len(rules)} queries parse, every metric they name is exposed")
