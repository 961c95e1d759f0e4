"""The web dashboard in headless Chromium against a running `tessera dev` (dashboard.sh starts it).

Each page is loaded by a real browser (Debian's chromium, headless, driven over the DevTools
protocol on a pipe): it runs the page's script, which reads the JSON API with a bearer token and
follows /v1/events. The DOM it leaves is checked
against the API's own answers, and a screenshot of each page is written to --out.

Steps:
 1. four jobs submitted with the CLI fill every GPU (32 on 4 servers); a fifth, 1-GPU job,
    submitted with the CLI too, must wait; the API's queue and `tessera status` say why
    (`capacity`);
 2. the cluster page: GPU figures equal /v1/status, one heat-map cell per GPU, each used
    cell coloured by the job the API places there, three replicas with one leader;
 3. the queue page and the waiting job's page say `capacity`;
 4. live: the job's page is open (its event stream delivering) while the filler jobs are
    cancelled with the CLI; the waiting job is placed, runs and finishes, and the same page,
    never reloaded, shows it finished;
 5. a server cordoned with the CLI is marked draining on the cluster page, and counted;
 6. the usage page shows the tenant's GPU-hours as the API reports them.
Exits non-zero, naming the check, on any mismatch.
"""

import argparse
import atexit
import html.parser
import json
import os
import re
import select
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--tls", required=True, help="the dev cluster's admin TLS directory")
p.add_argument("--ca", required=True, help="the dev cluster's CA directory (signs the token)")
p.add_argument("--tessera", required=True)
p.add_argument("--view", required=True, help="the dev cluster's gRPC addresses (TESSERA_VIEW)")
p.add_argument("--out", required=True, help="where the screenshots go")
args = p.parse_args()
os.makedirs(args.out, exist_ok=True)
base = f"https://127.0.0.1:{args.port}"
ctx = ssl.create_default_context(cafile=os.path.join(args.tls, "ca.pem"))
ctx.load_cert_chain(os.path.join(args.tls, "cert.pem"), os.path.join(args.tls, "key.pem"))
cli_env = dict(os.environ, TESSERA_VIEW=args.view, TESSERA_TLS=args.tls)
work = tempfile.mkdtemp(prefix="tessera-dashboard-")
atexit.register(shutil.rmtree, work, True)


def fail(what):
    print(f"dashboard check FAILED: {what}", file=sys.stderr)
    sys.exit(1)


def api(path):
    with urllib.request.urlopen(base + path, context=ctx, timeout=20) as r:
        return r.read().decode() if path == "/metrics" else json.loads(r.read())


def cli(*argv):
    r = subprocess.run([args.tessera, *argv], env=cli_env, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        fail(f"tessera {' '.join(argv)}: {r.stderr.strip()}")
    return r.stdout


def until(what, check, seconds=90):
    """Polls `check` (bounded) until it answers something truthy."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.25)
    fail(f"{what}: not within {seconds} s")


def submit(name, gpus, command):
    f = os.path.join(work, name + ".toml")
    with open(f, "w") as out:
        out.write(f'name = "{name}"\ngpus = {gpus}\ntenant = "vision"\ncommand = {json.dumps(command)}\n')
    m = re.search(r"submitted job (\d+)", cli("submit", f))
    if not m:
        fail(f"tessera submit {name}: no job id")
    return int(m.group(1))


token = cli("token", "create", "--ca", args.ca, "--role", "admin", "--name", "dashboard-test").strip()


def url(page):
    return f"{base}/ui#/{page}?token={token}"


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
    JSON messages ending in a NUL byte, on the child's fds 3 and 4): pages run in real time,
    and every wait is for a condition on the page, bounded."""

    def __init__(self):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        # The child's fds 3 and 4 (dup2 makes them inheritable; close_fds would close them).
        # Copied away first: either pipe end may itself be fd 3 or 4.
        def fds():
            r, w = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--ignore-certificate-errors",
             "--hide-scrollbars", "--remote-debugging-pipe", f"--user-data-dir={work}/chromium", "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(work, "chromium.log"), "w"))
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        atexit.register(self.close)  # also when a check fails and exits
        self.buf, self.next_id = b"", 0
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, self.session)

    def call(self, method, params=None, session=None, seconds=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + seconds
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == self.next_id:
                    if "error" in answer:
                        fail(f"browser: {method}: {answer['error']}")
                    return answer["result"]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_chrome], [], [], left)[0]:
                fail(f"browser: no answer to {method} within {seconds} s")
            chunk = os.read(self.from_chrome, 1 << 20)
            if not chunk:
                fail(f"browser: chromium exited (see {work}/chromium.log)")
            self.buf += chunk

    def eval(self, expression):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, self.session)
        if "exceptionDetails" in r:
            fail(f"browser: {expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def open(self, page):
        """Loads a page (a fresh document each time) and waits until its script has rendered
        view data (the main element carries the view version it showed)."""
        self.call("Page.navigate", {"url": "about:blank"}, self.session)
        self.call("Page.navigate", {"url": url(page)}, self.session)
        self.wait(f"page #/{page} renders",
                  "document.getElementById('main')?.dataset.loaded !== undefined || !!document.getElementById('page-error')")
        error = self.eval("document.getElementById('page-error')?.textContent")
        if error:
            fail(f"page #/{page}: the page shows an error: {error}")

    def wait(self, what, expression, seconds=30):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.eval(expression):
                return
            time.sleep(0.1)
        fail(f"browser: {what}: not within {seconds} s")

    def dom(self):
        return Dom(self.eval("document.documentElement.outerHTML"))

    def screenshot(self, name):
        import base64
        png = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                                         self.session)["data"])
        f = os.path.join(args.out, name + ".png")
        with open(f, "wb") as out:
            out.write(png)
        if len(png) < 5000:
            fail(f"screenshot {f}: {len(png)} bytes, an empty page?")
        print(f"  screenshot: {f} ({len(png)} bytes)")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Dom(html.parser.HTMLParser):
    """The elements of a DOM dump: each with its tag, attributes and text."""

    def __init__(self, text):
        super().__init__()
        self.elements, self.stack = [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        e = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.elements.append(e)
        if tag not in ("meta", "input", "br", "link", "img"):
            self.stack.append(e)

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for e in self.stack:
            e["text"] += data

    def by_id(self, id_):
        for e in self.elements:
            if e["attrs"].get("id") == id_:
                return e
        return None

    def text(self, id_):
        e = self.by_id(id_)
        if e is None:
            fail(f"no element #{id_} on the page")
        return e["text"].strip()

    def with_class(self, cls):
        return [e for e in self.elements if cls in (e["attrs"].get("class") or "").split()]


# 1. Fill the cluster with the CLI; a fifth job waits.
status = api("/v1/status")
total = status["gpus"]["total"]
servers = api("/v1/servers")["servers"]
per_server = servers[0]["gpus"]
fillers = [submit(f"filler-{i}", per_server, ["sleep", "600"]) for i in range(len(servers))]
until("the filler jobs run", lambda: all(api(f"/v1/jobs/{j}")["state"] == "running" for j in fillers))
waiter = submit("waiter", 1, ["sh", "-c", "echo hello from the dashboard test"])
queued = until("the queue explains the waiting job", lambda: next(
    (j for j in api("/v1/queue")["jobs"] if j["id"] == waiter and j["waiting"]["reason"] == "capacity"), None))
print(f"  job {waiter} waits: {queued['waiting']['message']}")
shown = cli("status", str(waiter))
if "waiting  capacity:" not in shown:
    fail(f"tessera status {waiter} does not say why it waits:\n{shown}")

# 2. The cluster page against the API.
status = api("/v1/status")
browser = Browser()
browser.open("")
dom = browser.dom()
for key in ("total", "used", "free"):
    shown = int(dom.text(f"gpus-{key}"))
    if shown != status["gpus"][key]:
        fail(f"cluster page: {shown} GPUs {key}, the API says {status['gpus'][key]}")
cells = dom.with_class("gpu")
if len(cells) != total:
    fail(f"cluster page: {len(cells)} GPU cells for {total} GPUs")
held = {}
for j in api("/v1/jobs?state=placed,running,migrating")["jobs"]:
    for m in j["placement"]:
        for g in m["gpus"]:
            held[(m["server"], g)] = j["id"]
shown = {}
# Cells carry their server through their parent row: walk rows in document order.
current = None
for e in dom.elements:
    if "data-server" in e["attrs"]:
        current = e["attrs"]["data-server"]
    elif "gpu" in (e["attrs"].get("class") or "").split() and "data-job" in e["attrs"]:
        shown[(current, int(e["attrs"]["data-gpu"]))] = int(e["attrs"]["data-job"])
if shown != held:
    fail(f"cluster page: GPU → job shown {sorted(shown.items())[:8]}…, the API places {sorted(held.items())[:8]}…")
replica_table = dom.by_id("replicas")["text"]
if replica_table.count("leader") != 1:
    fail(f"cluster page: replicas table should name one leader: {replica_table}")
print(f"  cluster page: {total} GPU cells, {len(held)} coloured by their job as the API places them, one leader")
browser.screenshot("cluster")

# 3. The queue and the waiting job's page.
browser.open("queue")
dom = browser.dom()
if f"{waiter}" not in dom.text("queue") or "capacity" not in dom.text("queue"):
    fail(f"queue page: job {waiter} with reason capacity not shown: {dom.text('queue')}")
browser.screenshot("queue")
browser.open(f"jobs/{waiter}")
dom = browser.dom()
if dom.text("job-state") != "pending" or "capacity" not in dom.text("job-waiting"):
    fail(f"job page: {dom.text('job-state')} / {dom.text('job-waiting')}")
browser.screenshot("job-waiting")


# 4. Live: the open job page follows the job to its end, on view events alone.
browser.wait("the job page's event stream delivers", "Number(document.getElementById('live').dataset.events || 0) >= 1")
browser.eval("window.neverReloaded = true")
for j in fillers:
    cli("cancel", str(j))
until("the waiting job finishes", lambda: api(f"/v1/jobs/{waiter}")["state"] == "finished", 60)
browser.wait("the open job page shows the job finished",
             "document.getElementById('job-state')?.textContent === 'finished'", 30)
if not browser.eval("window.neverReloaded === true"):
    fail("live job page: the page was reloaded, not updated")
dom = browser.dom()
events = int(dom.by_id("live")["attrs"].get("data-events", "0"))
if events < 2:
    fail(f"live job page: {events} view events received")
done_steps = [e["attrs"]["data-step"] for e in dom.with_class("done")]
if done_steps != ["submitted", "placed", "started", "ended"]:
    fail(f"live job page: timeline {done_steps}")
# The job's trace and its steps, as the API gives them.
detail = api(f"/v1/jobs/{waiter}")
if dom.text("job-trace") != detail["trace_id"]:
    fail(f"job page: trace {dom.text('job-trace')} but the API says {detail['trace_id']}")
steps_text = dom.text("job-steps")
for s in detail["timeline"]:
    if s["step"] not in steps_text:
        fail(f"job page: timeline lacks the step {s['step']}: {steps_text}")
if [s["step"] for s in detail["timeline"]][-1] != "ended":
    fail(f"API: the finished job's timeline does not end with `ended`: {detail['timeline']}")
print(f"  live: job {waiter}'s open page went from pending to finished on {events} view events, never reloaded; "
      f"trace {detail['trace_id']}, {len(detail['timeline'])} steps")
# Its output, from the logs link of the ended job (fetched from its node agent).
browser.eval("document.querySelector('#logs-links a').click()")
browser.wait("the ended job's log shows on its page",
             "(document.querySelector('#logs pre')?.textContent || '').includes('hello from the dashboard test')")
browser.screenshot("job-finished")

# 5. A cordoned server is marked on the cluster page, and counted.
cordoned = servers[-1]["name"]
cli("servers", "cordon", cordoned, "--reason", "dashboard test")
until("the cordon applies", lambda: api(f"/v1/servers/{cordoned}")["server"]["health"] == "draining", 30)
browser.open("")
dom = browser.dom()
marked = [e["attrs"]["data-server"] for e in dom.elements
          if "data-server" in e["attrs"] and "draining" in (e["attrs"].get("class") or "").split()]
if marked != [cordoned] or dom.text("servers-draining") != "1":
    fail(f"cluster page: draining servers marked {marked}, counted {dom.text('servers-draining')}; cordoned {cordoned}")
print(f"  cluster page: {cordoned} marked draining after tessera servers cordon")
browser.screenshot("cluster-cordoned")
cli("servers", "uncordon", cordoned)

# 6. Usage.
report = api(f"/v1/usage?by=tenant&from_ms={int(time.time() * 1000) - 30 * 86400000}")
want = next((r for r in report["rows"] if r["tenant"] == "vision"), None)
if want is None:
    fail(f"usage: the API has no row for tenant vision: {report}")
browser.open("usage")
dom = browser.dom()
text = dom.text("usage-tenants")
# The page reads its own range a moment later; running jobs no longer hold GPUs, so the
# tenant's figure is the same to the shown precision unless an hour boundary rounds it.
if "vision" not in text or f"{want['gpu_hours']:.3f}" not in text:
    fail(f"usage page: tenant vision {want['gpu_hours']:.3f} GPU-hours not shown: {text}")
print(f"  usage page: tenant vision {want['gpu_hours']:.3f} GPU-hours, as the API reports")
browser.screenshot("usage")
browser.close()
print(f"dashboard: every check passed; screenshots in {args.out}")
