"""Every PromQL expression deploy/k8s ships, checked by promtool (Debian's
`prometheus` package, tools/bootstrap.sh):

- the recording rules (deploy/k8s/monitoring/rules/hybridserve.rules.yaml)
  pass `promtool check rules`, and `promtool test rules` with their own
  recorded series (hybridserve.rules.test.yaml);
- per overlay, the series decode and prefill export as that overlay
  configures them (decode's page total = its --max_pages as the binary reads
  its flag files) give the expected autoscaling signals: an idle decode pod
  uses 0 of its pages, one with a quarter free 0.75;
- per overlay, the KEDA ScaledObjects' Prometheus trigger queries return
  one sample each, the pods' signal summed over the namespace;
- the prometheus-adapter example's queries, with the adapter's template
  filled in as it fills it, parse and return the recorded signals under the
  names the HorizontalPodAutoscalers read;
- the alerting rules (hybridserve.alerts.yaml) pass `promtool check rules`
  and their own `promtool test rules` cases (hybridserve.alerts.test.yaml),
  where every alert fires in one case and stays quiet in another; each
  alert's threshold moved either way (or its condition dropped) fails them;
- the Grafana dashboard (monitoring/grafana/hybridserve.json) has a panel
  for each thing operators look for, every PromQL expression in it parses
  (`promtool check rules` on a rules file made of them, Grafana's variables
  filled in), and every metric it, the alerts or the recording rules name is
  one decode, prefill or the cachestore exports (their metrics sources), one
  the recording rules record, or cert-manager's expiry; a renamed metric, a
  broken expression or a missing panel fails;
- promtool itself bites: the old backlog query (`group_left (` followed by
  an expression) and a ratio over a constant page count are refused."""

import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import yaml

import manifests as m

NAMESPACE = "hybridserve"


def rules_dir():
    return os.path.join(m.k8s_dir(), "monitoring", "rules")


def rules_file():
    return os.path.join(rules_dir(), "hybridserve.rules.yaml")


# The sources of the metrics decode, prefill and the cachestore export (each
# name a string literal there).
METRIC_SOURCES = ("decode/metrics.cc", "prefill/metrics.cc", "cachestore/server/service_metrics.cc")
# Metrics the alerts read that another exporter serves: cert-manager's.
EXTERNAL_METRICS = {"certmanager_certificate_expiration_timestamp_seconds"}
# What the dashboard must show (Deliver of issue 47): panel titles.
DASHBOARD_PANELS = {"Time to first token", "Inter-token latency", "Cached-token ratio", "Resume kinds",
                    "Queue depths", "KV page use", "Free KV pages and state slots", "Cache hit bytes",
                    "Publication failures", "Error ratio"}
# Grafana's variables, as a query would get them.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "${namespace}": NAMESPACE,
                     "$namespace": NAMESPACE}


def repo_file(path):
    """A file of this checkout: from Bazel's runfiles, else from the tree."""
    if "TEST_SRCDIR" in os.environ:
        return os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "hybridserve"), path)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", path)


def exported_metrics():
    """Every hybridserve_* name the metrics sources spell out."""
    names = set()
    for path in METRIC_SOURCES:
        with open(repo_file(path), encoding="utf-8") as f:
            names |= set(re.findall(r'"(hybridserve_[a-z0-9_]+)"', f.read()))
    return names


def dashboard_file():
    return os.path.join(m.k8s_dir(), "monitoring", "grafana", "hybridserve.json")


def dashboard_exprs(dashboard):
    """[(where, PromQL)] of every panel's targets (rows' panels included), with
    Grafana's variables filled in."""
    found = []

    def walk(panels):
        for panel in panels:
            walk(panel.get("panels") or [])
            for target in panel.get("targets") or []:
                expr = target.get("expr", "")
                for var, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(var, value)
                found.append((f"{panel.get('title')} {target.get('refId')}", expr))

    walk(dashboard.get("panels") or [])
    return found


def metric_names(expr):
    """The metric names a PromQL expression selects: every hybridserve or
    certmanager name, and any identifier written before a selector's braces
    (string literals, label values, aside)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    names = set(re.findall(r"\b((?:hybridserve|certmanager)[a-zA-Z0-9_:]*)", expr))
    return names | set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", expr))


def unknown_metrics(expr, exported, recorded, external=frozenset()):
    unknown = []
    for name in sorted(metric_names(expr)):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name in exported or base in exported or name in recorded or name in external:
            continue
        unknown.append(name)
    return unknown


def dashboard_errors(dashboard, exported, recorded):
    """What is wrong with a dashboard but its expressions' syntax: a panel
    missing, no expression, a variable left unfilled, an unknown metric."""
    errors = [f"no panel {t!r}" for t in sorted(DASHBOARD_PANELS - {p.get("title") for p in dashboard.get("panels", [])})]
    exprs = dashboard_exprs(dashboard)
    if not exprs:
        errors.append("no PromQL expression")
    for where, expr in exprs:
        if "$" in expr:
            errors.append(f"{where}: a Grafana variable left in {expr!r}")
        errors += [f"{where}: {n} is no metric hybridserve exports or records"
                   for n in unknown_metrics(expr, exported, recorded)]
    return errors


def alerts_file():
    return os.path.join(rules_dir(), "hybridserve.alerts.yaml")


# (what, text in hybridserve.alerts.yaml, its replacement): each must make the
# alert tests fail, a missed firing or a false one.
ALERT_BREAKAGES = [
    ("error ratio threshold 50 %", "          > 0.05\n", "          > 0.5\n"),
    ("error ratio threshold 0.5 % (calm's 1 % fires)", "          > 0.05\n", "          > 0.005\n"),
    ("prefill backlog threshold 40 s", "(hybridserve:prefill_backlog_seconds) > 4", "(hybridserve:prefill_backlog_seconds) > 40"),
    ("prefill backlog alert without its growth condition (calm's steady 6 s fires)",
     "          and on (namespace)\n          sum by (namespace) (deriv(hybridserve_prefill_queue_depth[10m])) > 0\n", ""),
    ("decode waiting threshold 40", "(hybridserve:num_requests_waiting) > 4", "(hybridserve:num_requests_waiting) > 40"),
    ("decode waiting alert without its growth condition (calm's steady 6 fires)",
     "          and on (namespace)\n          sum by (namespace) (deriv(hybridserve_num_requests_waiting[10m])) > 0\n", ""),
    ("cache errors over lookups threshold 0.05 (calm's 10 % fires)", "            > 0.5\n", "            > 0.05\n"),
    ("cache alert on decode's invalid arguments too", 'reason=~"unavailable|deadline_exceeded"', 'reason!=""'),
    ("cache alert without decode's publications", "unavailable|deadline_exceeded", "none"),
    ("certificate alert at 30 days (prefill's 20 fire)", "< 7 * 86400", "< 30 * 86400"),
    ("certificate alert at 1 day", "< 7 * 86400", "< 1 * 86400"),
]


def promtool(*args):
    """promtool's exit status and its output (stdout and stderr)."""
    done = subprocess.run(["promtool", *args], capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def _series(name, pod, values):
    return {"series": f'{name}{{job="kubernetes-pods",namespace="{NAMESPACE}",pod="{pod}"}}', "values": values}


def overlay_input(max_pages):
    """Recorded series of two decode pods sized as an overlay sizes them (one
    idle, one with a quarter of its pages free) and one prefill pod (2 queued,
    4 requests finished every 30 s taking 3 s in all: 0.75 s each)."""
    return [
        _series("hybridserve_kv_pages_free", "decode-idle", f"{max_pages}x20"),
        _series("hybridserve_kv_pages_total", "decode-idle", f"{max_pages}x20"),
        _series("hybridserve_num_requests_waiting", "decode-idle", "0x20"),
        _series("hybridserve_kv_pages_free", "decode-busy", f"{max_pages // 4}x20"),
        _series("hybridserve_kv_pages_total", "decode-busy", f"{max_pages}x20"),
        _series("hybridserve_num_requests_waiting", "decode-busy", "5x20"),
        _series("hybridserve_prefill_queue_depth", "prefill-a", "2x20"),
        _series("hybridserve_prefill_seconds_sum", "prefill-a", "10+3x20"),
        _series("hybridserve_prefill_seconds_count", "prefill-a", "20+4x20"),
    ]


# The signals overlay_input must give, by pod: {metric: {pod: value}}.
EXPECTED = {
    "kv_page_use_ratio": {"decode-idle": 0, "decode-busy": 0.75},
    "num_requests_waiting": {"decode-idle": 0, "decode-busy": 5},
    "prefill_backlog_seconds": {"prefill-a": 1.5},
}


def adapter_query(rule, pods):
    """A prometheus-adapter metricsQuery as the adapter fills it for a Pods
    metric of `pods` in the namespace (Series: the series' name,
    LabelMatchers: namespace and pods, GroupBy: pod)."""
    series = re.fullmatch(r"([A-Za-z_:][A-Za-z0-9_:]*)\{.*\}", rule["seriesQuery"]).group(1)
    matchers = f'namespace="{NAMESPACE}",pod=~"{"|".join(pods)}"'
    return (rule["metricsQuery"].replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)
            .replace("<<.GroupBy>>", "pod"))


def keda_queries(objs):
    """{signal: query} of the Prometheus triggers of an overlay's ScaledObjects."""
    queries = {}
    for so in m.find(objs, "ScaledObject"):
        for trigger in so["spec"]["triggers"]:
            query = trigger["metadata"]["query"]
            signal = re.match(r"hybridserve:([a-z_]+):sum\{", query)
            if signal is None:
                raise AssertionError(f"ScaledObject {so['metadata']['name']}: query {query!r} reads no recorded sum")
            queries[signal.group(1)] = query
    return queries


def tests_for(rules_path, max_pages, adapter_rules, keda=None):
    """A promtool test file over overlay_input(max_pages): the recorded
    signals, each adapter rule's query over them, and each KEDA query
    ({signal: query}): one sample, the sum over the namespace's pods."""
    expr_tests = []
    for metric, query in (keda or {}).items():
        expr_tests.append({
            "expr": query, "eval_time": "5m",
            "exp_samples": [{"labels": f'hybridserve:{metric}:sum{{namespace="{NAMESPACE}"}}',
                             "value": sum(EXPECTED[metric].values())}]})
    for metric, by_pod in EXPECTED.items():
        expr_tests.append({
            "expr": f"hybridserve:{metric}", "eval_time": "5m",
            "exp_samples": [{"labels": f'hybridserve:{metric}{{namespace="{NAMESPACE}",pod="{pod}"}}', "value": v}
                            for pod, v in by_pod.items()]})
    for rule in adapter_rules:
        metric = rule["name"]["as"].removeprefix("hybridserve_")
        by_pod = EXPECTED[metric]
        expr_tests.append({
            "expr": adapter_query(rule, sorted(by_pod)), "eval_time": "5m",
            "exp_samples": [{"labels": f'{{pod="{pod}"}}', "value": v} for pod, v in by_pod.items()]})
    return {"rule_files": [rules_path], "evaluation_interval": "30s",
            "tests": [{"interval": "30s", "input_series": overlay_input(max_pages),
                       "promql_expr_test": expr_tests}]}


class MonitoringRulesTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        if shutil.which("promtool") is None:
            raise AssertionError("promtool not found: install Debian's prometheus package (tools/bootstrap.sh)")
        cls.tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        cls.adapter_rules = m.monitoring_rules()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def promtool_test(self, name, tests):
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(tests, f, sort_keys=False)
        return promtool("test", "rules", path)

    def test_check_rules(self):
        rc, out = promtool("check", "rules", rules_file())
        self.assertEqual(rc, 0, out)
        self.assertIn("SUCCESS: 6 rules found", out)

    def test_alert_rules(self):
        rc, out = promtool("check", "rules", alerts_file())
        self.assertEqual(rc, 0, out)
        self.assertIn("SUCCESS: 5 rules found", out)
        rc, out = promtool("test", "rules", os.path.join(rules_dir(), "hybridserve.alerts.test.yaml"))
        self.assertEqual(rc, 0, out)
        # Every alert has a case where it fires and one where it is quiet.
        with open(alerts_file(), encoding="utf-8") as f:
            alerts = {r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]}
        self.assertEqual(alerts, {"HybridserveErrorRatioHigh", "HybridservePrefillQueueGrowing",
                                  "HybridserveDecodeQueueGrowing", "HybridserveCacheUnreachable",
                                  "HybridserveCertificateExpiring"})
        with open(os.path.join(rules_dir(), "hybridserve.alerts.test.yaml"), encoding="utf-8") as f:
            cases = [c for test in yaml.safe_load(f)["tests"] for c in test["alert_rule_test"]]
        for alert in alerts:
            self.assertTrue([c for c in cases if c["alertname"] == alert and c["exp_alerts"]], f"{alert} never fires")
            self.assertTrue([c for c in cases if c["alertname"] == alert and not c["exp_alerts"]], f"{alert} never quiet")

    def test_alert_tests_catch_broken_alerts(self):
        with open(alerts_file(), encoding="utf-8") as f:
            text = f.read()
        for what, old, new in ALERT_BREAKAGES:
            with self.subTest(breakage=what):
                self.assertIn(old, text)
                broken_dir = tempfile.mkdtemp(dir=self.tmp)
                with open(os.path.join(broken_dir, "hybridserve.alerts.yaml"), "w", encoding="utf-8") as f:
                    f.write(text.replace(old, new))
                for name in ("hybridserve.rules.yaml", "hybridserve.alerts.test.yaml"):
                    shutil.copy(os.path.join(rules_dir(), name), broken_dir)
                self.assertEqual(promtool("check", "rules", os.path.join(broken_dir, "hybridserve.alerts.yaml"))[0], 0)
                rc, out = promtool("test", "rules", os.path.join(broken_dir, "hybridserve.alerts.test.yaml"))
                self.assertNotEqual(rc, 0, f"the alert tests missed: {what}")

    def check_dashboard_parses(self, dashboard, name):
        """promtool check rules on a rules file recording each expression."""
        rules = [{"record": f"dashboard:expr_{i}", "expr": expr} for i, (_, expr) in
                 enumerate(dashboard_exprs(dashboard))]
        path = os.path.join(self.tmp, f"{name}.rules.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, sort_keys=False)
        return promtool("check", "rules", path)

    def test_dashboard(self):
        with open(dashboard_file(), encoding="utf-8") as f:
            dashboard = json.load(f)
        exported, recorded = exported_metrics(), set(m.recording_rules())
        self.assertGreater(len(exported), 50)
        self.assertEqual(dashboard_errors(dashboard, exported, recorded), [])
        rc, out = self.check_dashboard_parses(dashboard, "dashboard")
        self.assertEqual(rc, 0, out)
        self.assertIn(f"SUCCESS: {len(dashboard_exprs(dashboard))} rules found", out)
        # The alerts and the recording rules name exported or recorded metrics too.
        for path in (rules_file(), alerts_file()):
            with open(path, encoding="utf-8") as f:
                for group in yaml.safe_load(f)["groups"]:
                    for rule in group["rules"]:
                        with self.subTest(rule=rule.get("record") or rule.get("alert")):
                            self.assertEqual(unknown_metrics(rule["expr"], exported, recorded, EXTERNAL_METRICS), [])

    def test_dashboard_checks_bite(self):
        with open(dashboard_file(), encoding="utf-8") as f:
            text = f.read()
        exported, recorded = exported_metrics(), set(m.recording_rules())
        for what, old, new in [
                ("TTFT's histogram renamed", "hybridserve_time_to_first_token_seconds_bucket", "hybridserve_ttft_seconds_bucket"),
                ("a recorded series that is not recorded", "hybridserve:kv_page_use_ratio{", "hybridserve:kv_page_ratio{"),
                ("an exporter's metric hybridserve does not export", "sum(hybridserve_prefill_queue_depth{",
                 "sum(up{job=\\\"x\\\"} + hybridserve_prefill_queue_depth{"),
                ("a variable Grafana fills that the test does not", "[$__rate_interval]", "[$interval]")]:
            with self.subTest(breakage=what):
                self.assertIn(old, text)
                self.assertNotEqual(dashboard_errors(json.loads(text.replace(old, new, 1)), exported, recorded), [])
        dashboard = json.loads(text)
        dashboard["panels"] = [p for p in dashboard["panels"] if p["title"] != "Resume kinds"]
        self.assertEqual(dashboard_errors(dashboard, exported, recorded), ["no panel 'Resume kinds'"])
        broken = json.loads(text.replace("sum by (kind) (rate(hybridserve_resume_total", "sum by (kind (rate(hybridserve_resume_total"))
        self.assertEqual(dashboard_errors(broken, exported, recorded), [])
        rc, out = self.check_dashboard_parses(broken, "broken-dashboard")
        self.assertNotEqual(rc, 0, out)

    def test_recorded_series(self):
        rc, out = promtool("test", "rules", os.path.join(rules_dir(), "hybridserve.rules.test.yaml"))
        self.assertEqual(rc, 0, out)
        self.assertIn("SUCCESS", out)

    def test_every_overlay(self):
        overlays = m.overlays()
        self.assertTrue({"cpu", "gpu"} <= set(overlays), overlays)
        sizes = {}
        for overlay in overlays:
            with self.subTest(overlay=overlay):
                objs = m.render(overlay)
                max_pages = int(m.flags(objs, "decode")["max_pages"])
                sizes[overlay] = max_pages
                keda = keda_queries(objs)
                self.assertEqual(sorted(keda), sorted(EXPECTED))
                rc, out = self.promtool_test(f"{overlay}.test.yaml",
                                             tests_for(rules_file(), max_pages, self.adapter_rules, keda))
                self.assertEqual(rc, 0, f"{overlay} (--max_pages={max_pages}): {out}")
        # The two sizes the ratio must get right (a constant cannot).
        self.assertEqual((sizes["cpu"], sizes["gpu"]), (4096, 65536))

    def test_adapter_serves_each_recorded_signal(self):
        self.assertEqual(sorted(r["name"]["as"] for r in self.adapter_rules),
                         sorted(f"hybridserve_{k}" for k in EXPECTED))
        for rule in self.adapter_rules:
            self.assertRegex(rule["seriesQuery"], r'^hybridserve:[a-z_]+\{namespace!="",pod!=""\}$')

    def test_promtool_refuses_the_old_backlog_query(self):
        with open(rules_file(), encoding="utf-8") as f:
            text = f.read()
        old = text.replace("group_left ()\n            (\n", "group_left (\n").replace(
            "            )\n          )\n      # Decode KV", "          )\n      # Decode KV")
        self.assertNotEqual(old, text)
        path = os.path.join(self.tmp, "old.rules.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(old)
        rc, out = promtool("check", "rules", path)
        self.assertNotEqual(rc, 0, out)
        self.assertIn('unexpected "(" in grouping opts', out)

    def test_a_constant_page_count_fails_on_the_gpu_overlay(self):
        with open(rules_file(), encoding="utf-8") as f:
            text = f.read()
        constant = text.replace("/ on (namespace, pod) hybridserve_kv_pages_total", "/ 4096")
        self.assertNotEqual(constant, text)
        path = os.path.join(self.tmp, "constant.rules.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(constant)
        self.assertEqual(promtool("check", "rules", path)[0], 0)
        self.assertEqual(self.promtool_test("cpu-constant.test.yaml", tests_for(path, 4096, []))[0], 0)
        rc, out = self.promtool_test("gpu-constant.test.yaml", tests_for(path, 65536, []))
        self.assertNotEqual(rc, 0, out)
        self.assertIn("hybridserve:kv_page_use_ratio", out)


if __name__ == "__main__":
    unittest.main()
