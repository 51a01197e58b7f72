"""The OpenAI gateway's image recipe (deploy/docker/gateway.Dockerfile and its
lists) against what the tests run and what the manifests start.

No image is built here (no container engine that can pull a base), so this
checks what can be checked without one:
- gateway-requirements.txt pins exactly (name==version), once each, the
  gateway's packages at the versions GATEWAY_SPEC names, and everything they
  require, closed (each requirement pinned at a version its specifier admits,
  or one of the Debian packages the image installs), nothing more, and each at
  the version installed for the interpreter the tests run (this one): the image
  runs what the tests ran;
- gateway-build-constraints.txt builds the client's stubs with the grpcio-tools
  of Debian's grpcio (the stubs' floor), and the protobuf of Debian's;
- the Dockerfile: two debian:12-slim stages, the Debian list installed in the
  runtime stage, a venv at /opt/hybridserve/venv seeing Debian's packages,
  the requirements installed with --no-deps, the client[text] and the gateway
  with the constraints, `pip check`, the venv copied into the runtime stage,
  uid 10001, an exec-form ENTRYPOINT that is the command the Kubernetes
  manifests give the gateway's container.
Each check returns its violations; the test also runs each on mutated copies
and asserts they are reported."""

import importlib.metadata as metadata
import json
import os
import re
import unittest

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from runtime_libs_test import dockerfile_stages

VENV = "/opt/hybridserve/venv"
GATEWAY_COMMAND = f"{VENV}/bin/hybridserve-gateway"
# The gateway's own requirements (gateway/pyproject.toml; uvloop its event
# loop), pinned (and the client's chat templates' jinja2,
# tools/bootstrap.sh).
ROOTS = {"fastapi": "0.165.0", "granian": "2.8.9", "sse-starlette": "3.7.1", "tokenizers": "0.23.3",
         "prometheus-client": "0.26.0", "jinja2": "3.1.6", "uvloop": "0.23.0"}
# Python packages the image takes from Debian, as the test machines do:
# distribution name -> Debian package.
DEBIAN_PYTHON = {"grpcio": "python3-grpcio", "protobuf": "python3-protobuf", "pyyaml": "python3-yaml"}
# Where the requirements' markers are evaluated: the image's python3.
IMAGE_ENV = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux",
             "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64",
             "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def _runfile(relative):
    """A file of the repository: from Bazel's runfiles, else this checkout."""
    if "TEST_SRCDIR" in os.environ:
        return os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "hybridserve"), relative)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", relative)


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text):
    """({name: version}, [violations]) of a requirements file: one
    name==version a line, # comments."""
    pins, violations = {}, []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)", line)
        if not m:
            violations.append(f"not an exact pin (name==version): {line!r}")
            continue
        name = normalize(m.group(1))
        if name in pins:
            violations.append(f"{name} pinned twice")
        pins[name] = m.group(2)
    return pins, violations


def installed_version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def requirements_of(name):
    """The requirements of an installed distribution that apply in the
    image (markers evaluated there, no extras)."""
    found = []
    for text in metadata.requires(name) or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(IMAGE_ENV):
            found.append(req)
    return found


def requirements_violations(text, installed=installed_version, requires=requirements_of):
    """What gateway-requirements.txt gets wrong (see the module's doc)."""
    pins, violations = read_pins(text)
    for root, version in ROOTS.items():
        if pins.get(root) != version:
            violations.append(f"{root} pinned {pins.get(root)}, GATEWAY_SPEC's is {version}")
    for name in sorted(set(pins) & set(DEBIAN_PYTHON)):
        violations.append(f"{name} pinned from PyPI: the image takes it from Debian ({DEBIAN_PYTHON[name]})")
    for name, version in sorted(pins.items()):
        have = installed(name)
        if have != version:
            violations.append(f"{name}=={version} pinned, the tests run {have} (installed for this python)")
    # The closure from the roots: each requirement pinned (or Debian's), at
    # a version it admits.
    needed, todo = set(), [r for r in ROOTS if r in pins]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        if installed(name) != pins.get(name):
            continue  # reported above; its requirements are those of another version
        for req in requires(name):
            dep = normalize(req.name)
            if dep in DEBIAN_PYTHON:
                version = installed(dep)
                if version is None or not req.specifier.contains(Version(version), prereleases=True):
                    violations.append(f"{name} requires {req}, Debian's {DEBIAN_PYTHON[dep]} is {version}")
                continue
            if dep not in pins:
                violations.append(f"{name} requires {req}, which is not pinned")
                continue
            if not req.specifier.contains(Version(pins[dep]), prereleases=True):
                violations.append(f"{name} requires {req}, {dep} is pinned {pins[dep]}")
            todo.append(dep)
    extra = sorted(set(pins) - needed - set(DEBIAN_PYTHON))
    if extra:
        violations.append(f"pinned, yet nothing the gateway installs requires them: {extra}")
    return violations


def constraints_violations(text, installed=installed_version):
    """The build constraints: grpcio-tools (the client's stub generator, whose
    version is the stubs' grpcio floor) and grpcio at Debian's grpcio; protobuf
    at Debian's."""
    pins, violations = read_pins(text)
    grpcio, protobuf = installed("grpcio"), installed("protobuf")
    for name, want in (("grpcio-tools", grpcio), ("grpcio", grpcio), ("protobuf", protobuf)):
        if pins.get(name) != want:
            violations.append(f"build constraint {name}=={pins.get(name)}, Debian's "
                              f"{'grpcio' if name != 'protobuf' else 'protobuf'} is {want}")
    return violations


def manifest_command():
    """The command deploy/k8s/base/gateway.yaml gives the gateway container."""
    with open(_runfile("deploy/k8s/base/gateway.yaml"), encoding="utf-8") as f:
        for doc in yaml.safe_load_all(f):
            if doc and doc["kind"] == "Deployment":
                return next(c for c in doc["spec"]["template"]["spec"]["containers"]
                            if c["name"] == "gateway")["command"]
    return None


def dockerfile_violations(text, debian_list, command):
    """What gateway.Dockerfile gets wrong (see the module's doc); debian_list:
    gateway-debian-packages.txt's text; command: the manifests' command."""
    stages = dockerfile_stages(text)
    if len(stages) != 2:
        return [f"{len(stages)} stages, want a build stage and the runtime stage"]
    (build_from, build), (runtime_from, runtime) = stages
    violations = []
    for where, base in (("build", build_from), ("runtime", runtime_from)):
        if base.split()[0] != "debian:12-slim":
            violations.append(f"the {where} stage is FROM {base}, not debian:12-slim (the same python3 in both)")
    name = build_from.split()[-1] if " as " in build_from.lower() else "0"
    runs = lambda stage: [args for instruction, args in stage if instruction == "RUN"]
    copies = lambda stage: [args.split() for instruction, args in stage if instruction == "COPY"]
    listed = {line.split("#", 1)[0].strip() for line in debian_list.splitlines()} - {""}
    missing = sorted(({"python3"} | set(DEBIAN_PYTHON.values())) - listed)
    if missing:
        violations.append(f"gateway-debian-packages.txt lacks {missing}")
    for where, stage in (("build", build), ("runtime", runtime)):
        copied = [c[-1] for c in copies(stage) if "deploy/docker/gateway-debian-packages.txt" in c[:-1]]
        if not copied or not any(copied[0] in r and re.search(r"xargs\s+apt-get\s+install", r) for r in runs(stage)):
            violations.append(f"the {where} stage does not install gateway-debian-packages.txt (xargs apt-get install)")
    pip = f"{VENV}/bin/pip install --no-deps"
    if not any(re.search(rf"python3 -m venv --system-site-packages {re.escape(VENV)}\b", r) for r in runs(build)):
        violations.append(f"no venv at {VENV} with --system-site-packages (Debian's grpcio, protobuf, yaml)")
    requirements = [c[-1] for c in copies(build) if "deploy/docker/gateway-requirements.txt" in c[:-1]]
    target = lambda f: os.path.join(requirements[0], os.path.basename(f)) if requirements[0].endswith("/") else \
        requirements[0]
    if not requirements or not any(pip in r and f"-r {target('gateway-requirements.txt')}" in r for r in runs(build)):
        violations.append("the build stage does not pip install --no-deps -r gateway-requirements.txt into the venv")
    local = [r for r in runs(build) if pip in r and "client/python[text]" in r and "/src/gateway" in r]
    if not local:
        violations.append("the build stage does not pip install --no-deps client/python[text] and the gateway")
    elif not re.search(r"PIP_CONSTRAINT=\S*gateway-build-constraints\.txt", local[0]):
        violations.append("the local packages are built without the build constraints (PIP_CONSTRAINT)")
    if not any(f"{VENV}/bin/pip check" in r for r in runs(build)):
        violations.append("no pip check: a requirement the pins miss would pass the build")
    if not any(f"--from={name}" in c and c[-2].rstrip("/") == VENV and c[-1].rstrip("/") == VENV
               for c in copies(runtime)):
        violations.append(f"the runtime stage does not COPY --from={name} {VENV} to the same path")
    users = [args for instruction, args in runtime if instruction == "USER"]
    if not users or users[-1].split(":")[0] != "10001":
        violations.append(f"the runtime stage's last USER is {users[-1] if users else 'unset'}, not 10001")
    entrypoints = [args for instruction, args in runtime if instruction == "ENTRYPOINT"]
    try:
        entrypoint = json.loads(entrypoints[-1]) if entrypoints else None
    except ValueError:
        entrypoint = None
    if not isinstance(entrypoint, list):
        violations.append("the runtime stage has no ENTRYPOINT in exec (JSON array) form")
    elif entrypoint != [GATEWAY_COMMAND] or command != entrypoint:
        violations.append(f"ENTRYPOINT {entrypoint}, the manifests' command {command}, want [{GATEWAY_COMMAND}]")
    return violations


def _read(path):
    with open(_runfile(path), encoding="utf-8") as f:
        return f.read()


class GatewayImageTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dockerfile = _read("deploy/docker/gateway.Dockerfile")
        cls.requirements = _read("deploy/docker/gateway-requirements.txt")
        cls.constraints = _read("deploy/docker/gateway-build-constraints.txt")
        cls.debian = _read("deploy/docker/gateway-debian-packages.txt")

    def test_requirements_are_the_tested_closure(self):
        pins, _ = read_pins(self.requirements)
        print(f"{len(pins)} pins; Debian's grpcio {installed_version('grpcio')}, protobuf "
              f"{installed_version('protobuf')}, pyyaml {installed_version('pyyaml')}")
        self.assertEqual(requirements_violations(self.requirements), [])

    def test_build_constraints_match_debian(self):
        self.assertEqual(constraints_violations(self.constraints), [])

    def test_dockerfile(self):
        self.assertEqual(manifest_command(), [GATEWAY_COMMAND])
        self.assertEqual(dockerfile_violations(self.dockerfile, self.debian, manifest_command()), [])

    def test_wrong_requirements_are_caught(self):
        text = self.requirements
        mutations = {
            "a requirement left out (starlette)": re.sub(r"(?m)^starlette==.*\n", "", text),
            "a root at another version": text.replace("fastapi==0.165.0", "fastapi==0.164.0"),
            "a range, not a pin": text.replace("anyio==4.16.0", "anyio>=4"),
            "a pin nothing requires": text + "requests==2.32.3\n",
            "grpcio from PyPI": text + "grpcio==1.51.1\n",
            "a pin twice": text + "idna==3.21\n",
            "a dependency at a version its dependant refuses": text.replace("pydantic-core==2.50.5",
                                                                            "pydantic-core==2.50.4"),
        }
        for what, mutated in mutations.items():
            with self.subTest(mutation=what):
                self.assertNotEqual(mutated, text, f"the mutation '{what}' changed nothing")
                self.assertNotEqual(requirements_violations(mutated), [], f"not caught: {what}")
        # A requirement the installed version does not admit (the closure
        # check itself, on a fake metadata).
        fake = lambda name: [Requirement("anyio>=5")] if name == "starlette" else requirements_of(name)
        self.assertIn("starlette requires anyio>=5, anyio is pinned 4.16.0", requirements_violations(text, requires=fake))
        self.assertIn("build constraint grpcio-tools==1.60.0, Debian's grpcio is "
                      f"{installed_version('grpcio')}",
                      constraints_violations(self.constraints.replace("grpcio-tools==1.51.1", "grpcio-tools==1.60.0")))

    def test_wrong_dockerfile_is_caught(self):
        text, command = self.dockerfile, manifest_command()
        mutations = {
            "a fat runtime base": text.replace("FROM debian:12-slim\n", "FROM debian:12\n"),
            "no system site packages": text.replace("venv --system-site-packages", "venv"),
            "the requirements with their dependencies": text.replace(
                "pip install --no-deps --only-binary=:all: -r", "pip install --only-binary=:all: -r"),
            "no pip check": text.replace("/opt/hybridserve/venv/bin/pip check", "true"),
            "the client built with the latest grpcio-tools": text.replace(
                "PIP_CONSTRAINT=/tmp/gateway-build-constraints.txt", ""),
            "the venv not copied": text.replace("COPY --from=build /opt/hybridserve/venv/ /opt/hybridserve/venv/",
                                                "COPY --from=build /opt/hybridserve/venv/ /venv/"),
            "root at run time": text.replace("USER 10001:10001", "USER root"),
            "a shell-form ENTRYPOINT": re.sub(r"ENTRYPOINT .*", f"ENTRYPOINT {GATEWAY_COMMAND}", text),
            "the module, not the console script": re.sub(
                r"ENTRYPOINT .*", 'ENTRYPOINT ["/opt/hybridserve/venv/bin/python", "-m", "hybridserve_gateway"]', text),
        }
        for what, mutated in mutations.items():
            with self.subTest(mutation=what):
                self.assertNotEqual(mutated, text, f"the mutation '{what}' changed nothing")
                self.assertNotEqual(dockerfile_violations(mutated, self.debian, command), [], f"not caught: {what}")
        self.assertNotEqual(dockerfile_violations(text, self.debian.replace("python3-grpcio", ""), command), [])
        self.assertNotEqual(dockerfile_violations(text, self.debian, ["/usr/bin/hybridserve-gateway"]), [])


if __name__ == "__main__":
    unittest.main()
