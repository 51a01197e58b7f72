"""The container image recipe (deploy/docker/) against the binaries it ships.

No image is built here (no registry, no container engine that can pull a
base), so this test checks what can be checked without one:
- every library `ldd` resolves for the four binaries is owned by a Debian
  package (`dpkg -S`) or is a CUDA library under /usr/local/cuda;
- those packages, less what debian:12-slim already holds, equal
  deploy/docker/runtime-packages.txt, and the CUDA libraries equal
  deploy/docker/cuda-libraries.txt (a missing and an unneeded entry both fail,
  named);
- the Dockerfile installs both lists, builds and copies every binary the
  Kubernetes manifests run to /opt/hybridserve/bin, copies the default model to
  /models/default, runs as uid 10001 and has an exec-form ENTRYPOINT.
Each comparison is a function returning its violations, so the test also runs
it on a deliberately wrong list and asserts the violation is reported."""

import glob
import json
import os
import re
import subprocess
import unittest

# name in the image -> Bazel target (its runfile is the label's path).
BINARIES = {
    "cachestore": "//cachestore/server:cachestore",
    "prefill": "//prefill:prefill",
    "decode": "//decode:decode",
    "hybridserve_cli": "//client:hybridserve_cli",
}
IMAGE_BIN_DIR = "/opt/hybridserve/bin"
CUDA_PREFIX = "/usr/local/cuda"

# The packages of debian:12-slim (bookworm). The image is debuerreotype's
# "minbase" variant: every package of Priority: required, plus apt, closed over
# Depends and Pre-Depends (the slim variant removes documentation and locales,
# not packages). Computed from bookworm's Packages index (apt 2.6.x) with
# alternatives resolved as debootstrap does (mawk for awk, usr-is-merged). The
# libraries our binaries use are in it through apt: apt -> libstdc++6,
# libgcc-s1, libgnutls30 (-> libgmp10, libhogweed6, libnettle8, libidn2-0,
# libunistring2, libtasn1-6, libp11-kit0 -> libffi8); libapt-pkg6.0 ->
# libxxhash0, liblzma5, zlib1g; everything -> libc6. libssl3 is NOT in it
# (apt uses GnuTLS), nor is libatomic1.
DEBIAN_12_SLIM = frozenset("""
adduser apt base-files base-passwd bash bsdutils coreutils dash debconf
debian-archive-keyring debianutils diffutils dpkg e2fsprogs findutils
gcc-12-base gpgv grep gzip hostname init-system-helpers libacl1 libapt-pkg6.0
libattr1 libaudit-common libaudit1 libblkid1 libbz2-1.0 libc-bin libc6
libcap-ng0 libcap2 libcom-err2 libcrypt1 libdb5.3 libdebconfclient0 libext2fs2
libffi8 libgcc-s1 libgcrypt20 libgmp10 libgnutls30 libgpg-error0 libhogweed6
libidn2-0 liblz4-1 liblzma5 libmd0 libmount1 libnettle8 libp11-kit0
libpam-modules libpam-modules-bin libpam-runtime libpam0g libpcre2-8-0
libseccomp2 libselinux1 libsemanage-common libsemanage2 libsepol2
libsmartcols1 libss2 libstdc++6 libsystemd0 libtasn1-6 libtinfo6 libudev1
libunistring2 libuuid1 libxxhash0 libzstd1 login logsave mawk mount
ncurses-base ncurses-bin passwd perl-base sed sysvinit-utils tar tzdata
usr-is-merged util-linux util-linux-extra zlib1g
""".split())


def _runfile(relative):
    return os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "hybridserve"), relative)


def _label_path(label):
    return label.lstrip("/").replace(":", "/")


def read_list(path):
    """The entries of a one-per-line list file; `#` starts a comment."""
    with open(path, encoding="utf-8") as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


# --- what the binaries need ------------------------------------------------

def resolved_libraries(binary):
    """Paths `ldd` resolves for `binary`; names it could not resolve."""
    out = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    paths, missing = [], []
    for line in out.splitlines():
        line = line.strip()
        if "=> not found" in line:
            missing.append(line.split()[0])
            continue
        m = re.match(r"^(\S+) => (/\S+)", line) or re.match(r"^(/\S+) \(0x", line)
        if m:
            paths.append(m.group(m.lastindex))
    return paths, missing


def _usrmerge_variants(path):
    """`path` as dpkg may have recorded it: Debian 12 merges /lib into /usr/lib,
    and a package lists whichever of the two it shipped."""
    variants = [path]
    if path.startswith("/usr/"):
        variants.append(path[len("/usr"):])
    else:
        variants.append("/usr" + path)
    return variants


def owning_packages(path):
    """The Debian packages that own `path` (through symlinks: alternatives such
    as OpenBLAS's libopenblas.so.0 are owned only at their target); empty when
    none does."""
    for candidate in _usrmerge_variants(path) + _usrmerge_variants(os.path.realpath(path)):
        result = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True)
        if result.returncode != 0:
            continue
        packages = set()
        for line in result.stdout.splitlines():
            owners, owned = line.rsplit(": ", 1)
            if owned != candidate:
                continue  # dpkg -S matches substrings; keep exact paths only
            packages.update(owner.strip().split(":")[0] for owner in owners.split(","))
        if packages:
            return packages
    return set()


def classify(library_paths):
    """(Debian packages, CUDA sonames, paths that are neither) for the libraries."""
    packages, cuda, unowned = set(), set(), []
    for path in sorted(set(library_paths)):
        owners = owning_packages(path)
        if owners:
            packages |= owners
        elif path.startswith(CUDA_PREFIX) or os.path.realpath(path).startswith(CUDA_PREFIX):
            cuda.add(os.path.basename(path))
        else:
            unowned.append(path)
    return packages, cuda, unowned


def list_violations(what, needed, listed, list_name, in_base=frozenset()):
    """Messages naming what `list_name` lacks and what it has without need
    (`in_base`: needed, but the base image already has them)."""
    violations = []
    missing = sorted(set(needed) - set(listed))
    unneeded = sorted(set(listed) - set(needed) - set(in_base))
    redundant = sorted(set(listed) & set(in_base))
    if missing:
        violations.append(f"{list_name} lacks {what} the binaries need: {', '.join(missing)}")
    if unneeded:
        violations.append(f"{list_name} lists {what} no binary needs: {', '.join(unneeded)}")
    if redundant:
        violations.append(f"{list_name} lists {what} debian:12-slim already has: {', '.join(redundant)}")
    duplicated = sorted({x for x in listed if list(listed).count(x) > 1})
    if duplicated:
        violations.append(f"{list_name} lists more than once: {', '.join(duplicated)}")
    return violations


# --- what the Dockerfile does ----------------------------------------------

def dockerfile_stages(text):
    """[(FROM argument, [(INSTRUCTION, arguments)])] with continuation lines joined
    and comments dropped."""
    logical, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    stages = []
    for line in logical:
        instruction, _, arguments = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            stages.append((arguments.strip(), []))
        elif stages:
            stages[-1][1].append((instruction, " ".join(arguments.split())))
    return stages


def dockerfile_violations(text, binaries):
    """What the Dockerfile gets wrong about installing the lists and shipping
    `binaries` (name -> Bazel label)."""
    stages = dockerfile_stages(text)
    if len(stages) < 2:
        return ["the Dockerfile is not multi-stage (a build stage, then the runtime stage)"]
    build_from, build = stages[0]
    runtime_from, runtime = stages[-1]
    violations = []
    if not runtime_from.startswith("debian:12-slim"):
        violations.append(f"the runtime stage is FROM {runtime_from}, not debian:12-slim")
    if not build_from.startswith("debian:12"):
        violations.append(f"the build stage is FROM {build_from}, not debian:12")
    build_stage_name = build_from.split()[-1] if " as " in build_from.lower() else "0"

    def runs(stage):
        return [args for instruction, args in stage if instruction == "RUN"]

    def copies(stage):
        return [args.split() for instruction, args in stage if instruction == "COPY"]

    # runtime-packages.txt: copied into the runtime stage and installed from there.
    packages_copy = [c for c in copies(runtime) if "deploy/docker/runtime-packages.txt" in c[:-1]]
    if not packages_copy:
        violations.append("the runtime stage does not COPY deploy/docker/runtime-packages.txt")
    else:
        destination = packages_copy[0][-1]
        if not any(destination in run and re.search(r"xargs\s+apt-get\s+install", run) for run in runs(runtime)):
            violations.append(f"no RUN of the runtime stage installs {destination} with xargs apt-get install")
    # cuda-libraries.txt: read by the build stage, its output copied to the rpath.
    if not any("deploy/docker/cuda-libraries.txt" in run and f"{CUDA_PREFIX}/lib64" in run for run in runs(build)):
        violations.append(f"no RUN of the build stage copies deploy/docker/cuda-libraries.txt from {CUDA_PREFIX}/lib64")
    if not any(c[-1].rstrip("/") == f"{CUDA_PREFIX}/lib64" and f"--from={build_stage_name}" in c for c in copies(runtime)):
        violations.append(f"the runtime stage does not COPY the CUDA libraries to {CUDA_PREFIX}/lib64")
    # Every binary: built by the build stage, copied from it to /opt/hybridserve/bin.
    bazel_builds = " ".join(run for run in runs(build) if "bazel build" in run)
    for name, label in sorted(binaries.items()):
        if label not in bazel_builds.split():
            violations.append(f"the build stage does not bazel build {label} ({name})")
        destination = f"{IMAGE_BIN_DIR}/{name}"
        if not any(f"--from={build_stage_name}" in c and c[-1] == destination and c[-2].endswith("/" + name)
                   for c in copies(runtime)):
            violations.append(f"the runtime stage does not COPY --from={build_stage_name} .../{name} {destination}")
    if not any(c[-1].rstrip("/") == "/models/default" and c[-2].rstrip("/") == "models/default"
               for c in copies(runtime)):
        violations.append("the runtime stage does not COPY models/default to /models/default")
    users = [args for instruction, args in runtime if instruction == "USER"]
    if not users or users[-1].split(":")[0] != "10001":
        violations.append(f"the runtime stage's last USER is {users[-1] if users else 'unset'}, not 10001")
    entrypoints = [args for instruction, args in runtime if instruction == "ENTRYPOINT"]
    try:
        if not entrypoints or not isinstance(json.loads(entrypoints[-1]), list):
            raise ValueError
    except ValueError:
        violations.append("the runtime stage has no ENTRYPOINT in exec (JSON array) form")
    return violations


def manifest_binaries():
    """Image binaries the Kubernetes manifests in the runfiles (deploy/k8s) run,
    by name."""
    names = set()
    for path in glob.glob(os.path.join(_runfile("deploy/k8s"), "**", "*.yaml"), recursive=True):
        with open(path, encoding="utf-8") as f:
            names.update(re.findall(re.escape(IMAGE_BIN_DIR) + r"/([A-Za-z0-9_.-]+)", f.read()))
    return names


class RuntimeLibrariesTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.paths, cls.unresolved = [], []
        for name, label in BINARIES.items():
            paths, missing = resolved_libraries(_runfile(_label_path(label)))
            cls.paths += paths
            cls.unresolved += [f"{name}: {lib}" for lib in missing]
        cls.packages, cls.cuda, cls.unowned = classify(cls.paths)

    def test_every_library_resolves(self):
        self.assertEqual(self.unresolved, [], "ldd could not resolve these (nothing installs them)")

    def test_every_library_has_a_source(self):
        self.assertEqual(self.unowned, [],
                         f"libraries owned by no Debian package and not under {CUDA_PREFIX}: "
                         "the image cannot install them")

    def test_runtime_packages_are_exactly_what_ldd_needs(self):
        needed = self.packages - DEBIAN_12_SLIM
        listed = read_list(_runfile("deploy/docker/runtime-packages.txt"))
        print("packages the binaries need:", " ".join(sorted(self.packages)))
        print("of them in debian:12-slim:", " ".join(sorted(self.packages & DEBIAN_12_SLIM)))
        print("runtime-packages.txt must be:", " ".join(sorted(needed)))
        self.assertEqual(list_violations("packages", needed, listed, "runtime-packages.txt",
                                         self.packages & DEBIAN_12_SLIM), [])

    def test_cuda_libraries_are_exactly_what_ldd_needs(self):
        listed = read_list(_runfile("deploy/docker/cuda-libraries.txt"))
        print("CUDA libraries the binaries need:", " ".join(sorted(self.cuda)))
        self.assertEqual(list_violations("CUDA libraries", self.cuda, listed, "cuda-libraries.txt"), [])

    def test_a_wrong_list_is_named(self):
        # The comparison fails both ways, naming the entries: the real list less
        # one needed package, plus one no binary needs.
        needed = self.packages - DEBIAN_12_SLIM
        dropped = sorted(needed)[0]
        wrong = sorted(needed - {dropped}) + ["libcurl4"]
        violations = list_violations("packages", needed, wrong, "runtime-packages.txt")
        self.assertEqual(len(violations), 2, violations)
        self.assertIn(dropped, violations[0])
        self.assertIn("libcurl4", violations[1])
        # A package debian:12-slim already has is redundant in the list.
        in_base = self.packages & DEBIAN_12_SLIM
        violations = list_violations("packages", needed, sorted(needed) + ["libstdc++6"], "runtime-packages.txt",
                                     in_base)
        self.assertEqual(violations, ["runtime-packages.txt lists packages debian:12-slim already has: libstdc++6"])


class DockerfileTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        with open(_runfile("deploy/docker/Dockerfile"), encoding="utf-8") as f:
            cls.text = f.read()

    def test_manifests_run_only_binaries_the_image_ships(self):
        # Every binary the manifests run is one of BINARIES, which the next test
        # holds the Dockerfile to.
        used = manifest_binaries()
        print("binaries the manifests in the runfiles run:", " ".join(sorted(used)) or "(no manifests)")
        self.assertEqual(sorted(used), ["cachestore", "decode", "prefill"],
                         "the manifests (//deploy/k8s:manifests) should run the three services")
        unknown = sorted(used - set(BINARIES))
        self.assertEqual(unknown, [], f"the manifests run binaries the image does not ship: {unknown}")

    def test_installs_the_lists_and_ships_every_binary(self):
        self.assertEqual(dockerfile_violations(self.text, BINARIES), [])

    def test_a_wrong_dockerfile_is_caught(self):
        # Each mutation of the real Dockerfile must be reported.
        mutations = {
            "a binary not copied": self.text.replace(f"{IMAGE_BIN_DIR}/decode\n", "/tmp/decode\n"),
            "a binary not built": self.text.replace("//prefill:prefill", ""),
            "the package list not installed": self.text.replace("xargs apt-get install", "xargs echo"),
            "the CUDA list not copied": self.text.replace("deploy/docker/cuda-libraries.txt", "/dev/null"),
            "root at run time": self.text.replace("USER 10001:10001", "USER root"),
            "a shell-form ENTRYPOINT": re.sub(r"ENTRYPOINT .*", "ENTRYPOINT /opt/hybridserve/bin/decode", self.text),
            "a fat runtime base": self.text.replace("FROM debian:12-slim", "FROM debian:12"),
        }
        for what, text in mutations.items():
            self.assertTrue(text != self.text, f"the mutation '{what}' changed nothing")
            self.assertTrue(dockerfile_violations(text, BINARIES), f"not caught: {what}")


if __name__ == "__main__":
    unittest.main()
