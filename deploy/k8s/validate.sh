#!/usr/bin/env bash
# Validates the Kubernetes manifests of deploy/k8s offline: every object against the
# Kubernetes 1.37 OpenAPI schemas, strictly (an unknown field fails), with kubernetes-validate
# from PyPI (installed in a virtual environment under the build cache); then the manifests
# against each other: the replica configs in the ConfigMap name one replica per StatefulSet pod,
# with ids N + 1, advertise the pods' DNS names under the headless service, list every replica as
# a peer, and the files the pods and configs name exist.
set -euo pipefail
cd "$(dirname "$0")"
. ../python-tool.sh
python_tool k8s 'kubernetes-validate==1.37.0' kubernetes-validate
"$venv/bin/kubernetes-validate" --strict --quiet ./*.yaml
"$venv/bin/python" - ./*.yaml <<'PY'
import sys, tomllib, yaml
docs = [d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]
kind = lambda k, n: next(d for d in docs if d["kind"] == k and d["metadata"]["name"] == n)
sts, cm = kind("StatefulSet", "tessera-view"), kind("ConfigMap", "tessera-config")
ns, svc, n = sts["metadata"]["namespace"], sts["spec"]["serviceName"], sts["spec"]["replicas"]
assert kind("Service", svc)["spec"]["clusterIP"] == "None", "the StatefulSet's service must be headless"
args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
assert args[-1] == "/etc/tessera/$(POD_NAME).toml", args
dns = lambda i: f"tessera-view-{i}.{svc}.{ns}.svc.cluster.local"
for i in range(n):
    c = tomllib.loads(cm["data"][f"tessera-view-{i}.toml"])
    assert c["id"] == i + 1, (i, c["id"])
    assert (c["advertise"], c["raft_advertise"]) == (f"{dns(i)}:7101", f"{dns(i)}:7201"), c
    assert c["peers"] == [f"{j + 1}={dns(j)}:7101" for j in range(n)], c["peers"]
    assert c["raft_peers"] == [f"{j + 1}={dns(j)}:7201" for j in range(n)], c["raft_peers"]
    assert c["cluster_spec"] in cm["data"], c["cluster_spec"]
    tomllib.loads(cm["data"][c["cluster_spec"]])
    ports = {p["name"]: p["containerPort"] for p in sts["spec"]["template"]["spec"]["containers"][0]["ports"]}
    for key, name in [("listen", "client"), ("raft_listen", "raft"), ("http_listen", "http")]:
        assert c[key] == f"0.0.0.0:{ports[name]}", (key, c[key])
print(f"k8s: {len(docs)} objects valid against Kubernetes 1.37 (strict); {n} replica configs consistent")
PY
