"""Holds every #include of our own code to docs/ARCHITECTURE.md section 1.

The rules are read from the document, not copied here:
  - the package table ("Packages and dependency direction"): a package's
    files include, of our packages, only their own and those named in its
    "may depend on" column ("anything": any package above it), and every
    package that column names sits above it in the table;
  - the list of narrower rules below the table, one bullet each:
        - `pkg/` includes `prefix/`, ... only in `file`, ...
    A file named without an extension stands for its .h, .cc, .cu and .cuh;
    text in parentheses is a comment. Tests (a file whose name has `_test`
    or starts with `test_`) are held to the table only.
The sources are the workspace's own files (this test runs outside the
sandbox and is never cached: see BUILD.bazel).
"""

import os
import re
import sys
import unittest

DOC = "docs/ARCHITECTURE.md"
SOURCE_EXTENSIONS = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
BACKTICKED = re.compile(r"`([^`]+)`")
RULE = re.compile(r"^((?:`[\w/]+/`(?:, | and )?)+) includes? (.+?) only in (.+?)\.?$")
TEST_FILE = re.compile(r"(^|_)test(_|s?\.|$)")


def find_workspace():
  """The workspace root: the real location of this test's copy of the doc."""
  for base in (os.environ.get("TEST_SRCDIR"), os.environ.get("RUNFILES_DIR")):
    if base:
      doc = os.path.join(base, os.environ.get("TEST_WORKSPACE", "hybridserve"), DOC)
      if os.path.exists(doc):
        return os.path.dirname(os.path.dirname(os.path.realpath(doc)))
  here = os.path.dirname(os.path.realpath(__file__))
  return os.path.dirname(os.path.dirname(here))


def strip_parentheses(text):
  while True:
    stripped = re.sub(r"\([^()]*\)", "", text)
    if stripped == text:
      return text
    text = stripped


def section_lines(doc_text, heading):
  lines = doc_text.splitlines()
  start = lines.index(heading) + 1
  end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
  return lines[start:end]


def parse_rules(doc_text):
  """(order, allowed, narrow, unread): the table's packages top to bottom,
  what each may include (None: anything above it), the narrower rules as
  (package, include prefixes, allowed files, the bullet's text), and the
  bullets that say "only in" but do not read as a rule."""
  lines = section_lines(doc_text, "### Packages and dependency direction")
  order, cells = [], {}
  for line in lines:
    m = re.match(r"^\| `(\w+)/` \|", line)
    if m:
      columns = [c.strip() for c in line.strip().strip("|").split("|")]
      order.append(m.group(1))
      cells[m.group(1)] = columns[2]
  allowed = {}
  for package in order:
    cell = cells[package]
    if re.search(r"\banything\b", cell):
      allowed[package] = None
    else:
      allowed[package] = {t.rstrip("/") for t in BACKTICKED.findall(cell) if t.rstrip("/") in cells}
  # A bullet wraps: its continuation lines are indented.
  bullets, current = [], None
  for line in lines:
    if line.startswith("- "):
      current = [line[2:].strip()]
      bullets.append(current)
    elif current is not None and line.startswith("  ") and line.strip():
      current.append(line.strip())
    else:
      current = None
  narrow, unread = [], []
  for bullet in (" ".join(parts) for parts in bullets):
    m = RULE.match(bullet)
    if not m:
      if " only in " in bullet:
        unread.append(bullet)
      continue
    packages = [p.rstrip("/") for p in BACKTICKED.findall(m.group(1))]
    prefixes = BACKTICKED.findall(strip_parentheses(m.group(2)))
    files = BACKTICKED.findall(strip_parentheses(m.group(3)))
    for package in packages:
      narrow.append((package, prefixes, files, bullet))
  return order, allowed, narrow, unread


def sources(root, packages):
  """{path relative to root: [included paths]} for every source file under
  the table's packages."""
  found = {}
  for package in packages:
    for directory, dirs, files in os.walk(os.path.join(root, package)):
      dirs[:] = sorted(d for d in dirs if not d.startswith((".", "bazel-")))
      for name in sorted(files):
        if name.endswith(SOURCE_EXTENSIONS):
          path = os.path.join(directory, name)
          with open(path, encoding="utf-8", errors="replace") as f:
            includes = [m.group(1) for m in map(INCLUDE.match, f) if m]
          found[os.path.relpath(path, root)] = includes
  return found


def file_named(path, package, name):
  relative = path[len(package) + 1:]
  if name.endswith("/"):  # a folder of the package: every file under it
    return relative.startswith(name)
  if os.path.splitext(name)[1]:
    return relative == name
  stem, extension = os.path.splitext(relative)
  return stem == name and extension in SOURCE_EXTENSIONS


def violations(order, allowed, narrow, files):
  """Every breach, one line each, naming the file and the include."""
  found = []
  rank = {p: i for i, p in enumerate(order)}
  for package in order:
    for dependency in allowed[package] or ():
      if rank[dependency] >= rank[package]:
        found.append(f"{DOC}: `{package}/` may depend on `{dependency}/`, which is not above it in the table")
  for path, includes in sorted(files.items()):
    package = path.split("/")[0]
    may = allowed[package]
    for include in includes:
      target = include.split("/")[0]
      if target not in rank or target == package:
        continue
      if may is None and rank[target] < rank[package]:
        continue
      if may is not None and target in may:
        continue
      found.append(f'{path}: #include "{include}": `{package}/` may not depend on `{target}/` '
                   f"({DOC}, the package table)")
  for package, prefixes, names, bullet in narrow:
    for path, includes in sorted(files.items()):
      if not path.startswith(package + "/") or TEST_FILE.search(os.path.basename(path)):
        continue
      if any(file_named(path, package, name) for name in names):
        continue
      for include in includes:
        if any(include.startswith(prefix) for prefix in prefixes):
          rule = re.sub(r" ([.,])", r"\1", " ".join(strip_parentheses(bullet).split()))
          found.append(f'{path}: #include "{include}": only {", ".join(names)} may ({DOC}: "{rule}")')
  return found


class DependencyRulesTest(unittest.TestCase):

  @classmethod
  def setUpClass(cls):
    cls.root = find_workspace()
    with open(os.path.join(cls.root, DOC), encoding="utf-8") as f:
      cls.order, cls.allowed, cls.narrow, cls.unread = parse_rules(f.read())
    cls.files = sources(cls.root, cls.order)

  def test_the_document_states_the_rules(self):
    # The parse found the table and the list; a reworded table or bullet
    # that no longer parses must fail here, not silently check nothing.
    for package in ("proto", "common", "kernels", "engine", "transport", "cachestore", "worker", "prefill",
                    "decode", "client", "tests", "bench"):
      self.assertIn(package, self.order)
    self.assertEqual(self.unread, [], f"{DOC}: bullets that do not read as `pkg/` includes `x/` only in `file`")
    self.assertEqual(self.allowed["proto"], set())
    self.assertEqual(self.allowed["kernels"], set())
    ruled = {(package, prefix) for package, prefixes, _, _ in self.narrow for prefix in prefixes}
    for rule in (("common", "grpcpp/"), ("cachestore", "proto/"), ("transport", "engine/"),
                 ("transport", "kernels/"), ("engine", "kernels/cpu/"), ("decode", "worker/"),
                 ("prefill", "worker/")):
      self.assertIn(rule, ruled)
    for package, prefixes, names, bullet in self.narrow:
      for name in names:
        self.assertTrue(any(file_named(p, package, name) for p in self.files),
                        f"{DOC} names {package}/{name}, which does not exist: {bullet}")

  def test_the_sources_were_found(self):
    self.assertIn("common/grpc_status.h", self.files)
    self.assertIn("kernels/backend.h", self.files)
    self.assertGreater(len(self.files), 300)

  def test_every_include_keeps_the_rules(self):
    found = violations(self.order, self.allowed, self.narrow, self.files)
    self.assertEqual(found, [], "\n" + "\n".join(found))


if __name__ == "__main__":
  sys.argv[1:] = []
  unittest.main()
