#!/usr/bin/env python3
"""One summary of a `bazel test` run: targets and test cases passed, failed and
skipped, and every skipped case with its reason.

    tools/test_summary.py --testlogs "$(bazel info bazel-testlogs)" //...

Reads the JUnit XML that Bazel keeps for each test target (GoogleTest writes
one testcase per TEST with result="skipped" and the GTEST_SKIP message; for
other tests Bazel writes one testcase for the whole target) and, for Python
unittest targets, the "OK (skipped=N)" line and "skipped '...'" reasons of
their log. Only the targets the pattern names are read, so stale logs of
removed targets do not count. Exit status: 0 (the caller keeps bazel's).

With --times N, also the N slowest targets with their seconds: the time each
test.xml records (GoogleTest's whole run; Bazel's for tests it wraps),
summed over a sharded test's shards and a --runs_per_test run's runs, with
the longest of them beside it; process start and exit (sanitizers' leak
checks) are outside it.
"""

import argparse
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET


def test_targets(patterns):
    """The tests of `patterns`, as bazel test reads them: a pattern starting
    with "-" takes its targets out."""
    query = ""
    for p in patterns:
        if p.startswith("-"):
            query += f" - tests({p[1:]})"
        else:
            query += (" + " if query else "") + f"tests({p})"
    out = subprocess.run(["bazel", "query", query], check=True, capture_output=True, text=True).stdout
    return sorted(line.strip() for line in out.splitlines() if line.strip().startswith("//"))


def log_dir(testlogs, target):
    package, name = target[2:].split(":", 1)
    return os.path.join(testlogs, package, name)


def python_cases(log_path):
    """(cases run, skipped, failed, skip reasons) from a unittest log."""
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        return 0, 0, 0, []
    ran = sum(int(n) for n in re.findall(r"^Ran (\d+) tests? in", text, re.M))
    reasons = re.findall(r"^(\S+ \([\w.]+\)) \.\.\. skipped '(.*)'$", text, re.M)
    skipped = sum(int(n) for n in re.findall(r"^(?:OK|FAILED) \(.*?skipped=(\d+).*\)$", text, re.M))
    failed = sum(int(n) for n in re.findall(r"^FAILED \(.*?(?:failures|errors)=(\d+)", text, re.M))
    failed += sum(int(n) for n in re.findall(r"^FAILED \(failures=\d+, errors=(\d+)", text, re.M))
    return ran, max(skipped, len(reasons)), failed, [f"{case}: {why}" for case, why in reasons]


def _seconds(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def xml_seconds(root):
    """The seconds a test.xml records: its root's time (GoogleTest), else its
    suites' sum, else its cases' (Bazel's own test.xml for wrapped tests
    carries time and duration on the testcase)."""
    t = _seconds(root.get("time"))
    if t is not None:
        return t
    suites = [_seconds(ts.get("time")) for ts in root.iter("testsuite")]
    if suites and all(v is not None for v in suites):
        return sum(suites)
    cases = [_seconds(tc.get("time", tc.get("duration"))) for tc in root.iter("testcase")]
    return sum(v for v in cases if v is not None)


_PART = re.compile(r"(shard|run)_\d+_of_(\d+)")


def target_xmls(d):
    """A target's test.xml files from its latest `bazel test`: one per shard
    and per run when it was sharded or run several times (shard_I_of_N/,
    run_I_of_M/, or both nested), else its own. Bazel leaves the folders of
    earlier invocations with other counts (and a test.xml from before
    sharding) in place: of the layouts present, the one written last wins."""
    layouts = {}
    if os.path.isfile(os.path.join(d, "test.xml")):
        layouts[()] = [os.path.join(d, "test.xml")]
    for root, dirs, files in os.walk(d) if os.path.isdir(d) else []:
        rel = os.path.relpath(root, d)
        if rel == ".":
            continue
        parts = [_PART.fullmatch(p) for p in rel.split(os.sep)]
        if not all(parts):
            dirs[:] = []
            continue
        if "test.xml" in files and not any(_PART.fullmatch(x) for x in dirs):
            layout = tuple((m.group(1), m.group(2)) for m in parts)
            layouts.setdefault(layout, []).append(os.path.join(root, "test.xml"))
    if not layouts:
        return [os.path.join(d, "test.xml")]
    newest = max(layouts.values(), key=lambda paths: max(os.path.getmtime(p) for p in paths))
    return sorted(newest)


def target_times(testlogs, targets):
    """(seconds, parts, longest part's seconds, target) for each target whose
    test.xml files are all readable, slowest first."""
    out = []
    for target in targets:
        paths = target_xmls(log_dir(testlogs, target))
        try:
            times = [xml_seconds(ET.parse(p).getroot()) for p in paths]
        except (OSError, ET.ParseError):
            continue
        out.append((sum(times), len(times), max(times), target))
    return sorted(out, key=lambda t: (-t[0], t[3]))


def format_times(label, times, limit):
    lines = []
    for seconds, parts, longest, target in times[:limit]:
        extra = f" ({parts} shards/runs, longest {longest:.1f} s)" if parts > 1 else ""
        lines.append(f"TIME {seconds:8.1f} s  {target}{extra}")
    total = sum(t[0] for t in times)
    lines.append(f"TIMES {label}: {len(times)} targets, {total:.1f} s of test time"
                 + (f"; the {min(limit, len(times))} slowest above" if times else ""))
    return lines


def summarize(testlogs, targets):
    totals = dict(targets=0, passed_targets=0, failed_targets=0, missing=0, cases=0, passed=0, failed=0, skipped=0)
    skipped_lines, failed_lines = [], []
    for target in targets:
        d = log_dir(testlogs, target)
        totals["targets"] += 1
        xml_paths = target_xmls(d)
        if not all(os.path.exists(p) for p in xml_paths):
            totals["missing"] += 1  # not run (a build failure, or filtered out)
            continue
        try:
            roots = [ET.parse(p).getroot() for p in xml_paths]
        except ET.ParseError as e:
            totals["failed_targets"] += 1
            failed_lines.append(f"FAILED  {target}: unreadable test.xml ({e})")
            continue
        target_failed = False
        cases = [tc for root in roots for tc in root.iter("testcase")]
        gtest = any(tc.get("classname") for tc in cases)
        if not gtest:
            # A test Bazel wrapped whole (Python unittest): its cases from the log.
            target_failed = any(tc.find("failure") is not None or tc.find("error") is not None for tc in cases)
            ran, skipped_count, failed_count, reasons = python_cases(os.path.join(d, "test.log"))
            ran = ran or len(cases)
            failed_count = failed_count or (1 if target_failed else 0)
            totals["cases"] += ran
            totals["skipped"] += skipped_count
            totals["failed"] += failed_count
            totals["passed"] += max(ran - skipped_count - failed_count, 0)
            if target_failed:
                failed_lines.append(f"FAILED  {target}")
            skipped_lines += [f"SKIPPED {target} {r}" for r in reasons]
            if skipped_count > len(reasons):
                skipped_lines.append(f"SKIPPED {target}: {skipped_count - len(reasons)} case(s), reasons in its test.log")
        for tc in cases if gtest else []:
            totals["cases"] += 1
            name = f"{tc.get('classname')}.{tc.get('name')}"
            if tc.find("failure") is not None or tc.find("error") is not None:
                totals["failed"] += 1
                target_failed = True
                failed_lines.append(f"FAILED  {target} {name}")
            elif tc.get("result") == "skipped" or tc.find("skipped") is not None:
                totals["skipped"] += 1
                why = tc.find("skipped").get("message", "") if tc.find("skipped") is not None else ""
                why = why.split("\n", 1)[-1].strip() or "(no reason given)"
                skipped_lines.append(f"SKIPPED {target} {name}: {why}")
            else:
                totals["passed"] += 1
        totals["failed_targets" if target_failed else "passed_targets"] += 1
    return totals, skipped_lines, failed_lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--testlogs", required=True, help="bazel info bazel-testlogs (for the same configuration)")
    ap.add_argument("--label", default="tests", help="what this run was, printed first")
    ap.add_argument("--times", type=int, default=0, metavar="N",
                    help="also list the N slowest targets with their seconds")
    ap.add_argument("patterns", nargs="*", default=["//..."])
    args = ap.parse_args()
    targets = test_targets(args.patterns)
    totals, skipped, failed = summarize(args.testlogs, targets)
    for line in failed + skipped:
        print(line)
    t = totals
    print(
        f"SUMMARY {args.label}: {t['targets']} targets: {t['passed_targets']} passed, {t['failed_targets']} failed"
        + (f", {t['missing']} not run" if t["missing"] else "")
        + f"; {t['cases']} cases: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped"
    )
    if args.times > 0:
        for line in format_times(args.label, target_times(args.testlogs, targets), args.times):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
