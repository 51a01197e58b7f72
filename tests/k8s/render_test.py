"""deploy/k8s/render.sh, the release artifacts: one YAML file per overlay
(and one for namespace/), each the overlay's render with every container's
image on the given digest and every object labelled with the version, valid
against the Kubernetes schemas (kubernetes-validate --strict; only the custom
resources the policy test checks may lack a schema). render.sh refuses a
missing or malformed --digest and --version, naming the flag."""

import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

import manifests as m

VERSION = "1.2.3"
IMAGE = "registry.example/hybridserve"
DIGEST = "sha256:" + "0123456789abcdef" * 4
K8S_VERSION = "1.32.0"


def render_sh(*args, out):
    return subprocess.run(["bash", os.path.join(m.k8s_dir(), "render.sh"), *args, "--out", out],
                          capture_output=True, text=True)


def validator():
    """A python with kubernetes-validate: this one, else the system's."""
    for python in (sys.executable, "/usr/bin/python3"):
        if subprocess.run([python, "-c", "import kubernetes_validate"], capture_output=True).returncode == 0:
            return python
    raise AssertionError("kubernetes-validate is not installed (tools/bootstrap.sh)")


def release_errors(objs, expected):
    """What a release file gets wrong against the overlay's render: an image
    not on the digest, an object without the version label, any other
    difference."""
    errors = []
    want = f"{IMAGE}@{DIGEST}"
    for o in objs:
        name = f"{o['kind']}/{o['metadata']['name']}"
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/version") != VERSION:
            errors.append(f"{name}: no app.kubernetes.io/version={VERSION}")
        spec = o.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if c.get("image") != want:
                errors.append(f"{name}: container {c['name']} runs {c.get('image')}, want {want}")
    # Apart from those two, exactly the overlay's objects.
    stripped = copy.deepcopy(objs)
    for o in stripped:
        (o["metadata"].get("labels") or {}).pop("app.kubernetes.io/version", None)
        if o["metadata"].get("labels") == {}:
            del o["metadata"]["labels"]
        for c in o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            c["image"] = "hybridserve:latest"
    key = lambda o: (o["kind"], o["metadata"]["name"])
    if sorted(stripped, key=key) != sorted(expected, key=key):
        errors.append("the objects differ from the overlay's render beyond the image and the version label")
    return errors


class RenderTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        cls.out = os.path.join(cls.tmp, "release")
        done = render_sh("--version", VERSION, "--digest", DIGEST, "--image", IMAGE, out=cls.out)
        if done.returncode != 0:
            raise AssertionError(f"render.sh failed: {done.stderr}")
        cls.files = {}
        for overlay in m.overlays() + ["namespace"]:
            path = os.path.join(cls.out, f"hybridserve-{VERSION}-{overlay}.yaml")
            with open(path, encoding="utf-8") as f:
                cls.files[overlay] = (path, [o for o in yaml.safe_load_all(f) if o])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_one_file_per_overlay(self):
        self.assertEqual(sorted(os.listdir(self.out)),
                         sorted(f"hybridserve-{VERSION}-{o}.yaml" for o in m.overlays() + ["namespace"]))
        self.assertEqual(len(m.overlays()), 4)

    def test_each_file_is_its_overlay_on_the_digest(self):
        for overlay in m.overlays():
            with self.subTest(overlay=overlay):
                objs = self.files[overlay][1]
                self.assertEqual(release_errors(objs, m.render(overlay)), [])
                self.assertEqual(len([o for o in objs if o["kind"] == "Deployment"]), 3)
        self.assertEqual(release_errors(self.files["namespace"][1], m.render_namespace()), [])

    def test_each_file_validates(self):
        python = validator()
        for name, (path, objs) in self.files.items():
            with self.subTest(file=os.path.basename(path)):
                done = subprocess.run([python, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", K8S_VERSION,
                                       path], capture_output=True, text=True)
                self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
                missing = set(re.findall(r"Couldn't find schema for kind (\S+) with api version (\S+)",
                                         done.stdout + done.stderr))
                self.assertLessEqual({(api, kind) for kind, api in missing}, m.CUSTOM_KINDS)
                self.assertEqual(len(missing), len({(o["apiVersion"], o["kind"]) for o in objs} & m.CUSTOM_KINDS))

    def test_release_check_catches_a_file_off_the_digest(self):
        objs = copy.deepcopy(self.files["cpu"][1])
        m.one(objs, "Deployment", "hybridserve-prefill")["spec"]["template"]["spec"]["containers"][0]["image"] = \
            f"{IMAGE}:latest"
        self.assertIn(f"Deployment/hybridserve-prefill: container prefill runs {IMAGE}:latest, want {IMAGE}@{DIGEST}",
                      release_errors(objs, m.render("cpu")))
        objs = copy.deepcopy(self.files["gpu"][1])
        del m.one(objs, "Service", "hybridserve-decode")["metadata"]["labels"]["app.kubernetes.io/version"]
        self.assertNotEqual(release_errors(objs, m.render("gpu")), [])
        objs = copy.deepcopy(self.files["cpu"][1])
        m.one(objs, "Deployment", "hybridserve-decode")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1
        self.assertNotEqual(release_errors(objs, m.render("cpu")), [])

    def test_refuses_bad_flags(self):
        for args, flag in ((["--version", VERSION], "--digest"),
                           (["--version", VERSION, "--digest", "sha256:abc"], "--digest"),
                           (["--version", VERSION, "--digest", DIGEST.upper()], "--digest"),
                           (["--digest", DIGEST], "--version"),
                           (["--version", "1.2 3", "--digest", DIGEST], "--version"),
                           (["--version", VERSION, "--digest", DIGEST, "--image", f"{IMAGE}@{DIGEST}"], "--image")):
            with self.subTest(args=args):
                out = os.path.join(self.tmp, "refused")
                done = render_sh(*args, out=out)
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertIn(f"render.sh: {flag} must be", done.stderr)
                self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
