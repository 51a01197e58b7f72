"""deploy/k8s/render.sh, the release artifacts: one YAML file per overlay
(and one for namespace/), each the overlay's render with every container's
image on its image's digest (the workers' hybridserve, the OpenAI gateway's
hybridserve-gateway) and every object labelled with the version, valid
against the Kubernetes schemas (kubernetes-validate --strict; only the custom
resources the policy test checks may lack a schema). render.sh refuses a
missing or malformed --digest, --gateway-digest and --version, naming the
flag."""

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
GATEWAY_IMAGE = "registry.example/openai/gateway"
GATEWAY_DIGEST = "sha256:" + "fedcba9876543210" * 4
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

    def containers(o):
        spec = o.get("spec", {}).get("template", {}).get("spec", {})
        return spec.get("containers", []) + spec.get("initContainers", [])

    # Each container's image in the overlay's own render (hybridserve:latest,
    # hybridserve-gateway:latest) and the one the release must run.
    unpinned = {(o["kind"], o["metadata"]["name"], c["name"]): c.get("image") for o in expected for c in containers(o)}
    release = {"hybridserve": f"{IMAGE}@{DIGEST}", m.GATEWAY_IMAGE: f"{GATEWAY_IMAGE}@{GATEWAY_DIGEST}"}
    for o in objs:
        name = f"{o['kind']}/{o['metadata']['name']}"
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/version") != VERSION:
            errors.append(f"{name}: no app.kubernetes.io/version={VERSION}")
        for c in containers(o):
            image = unpinned.get((o["kind"], o["metadata"]["name"], c["name"]), "")
            want = release.get(image.rsplit(":", 1)[0])
            if c.get("image") != want:
                errors.append(f"{name}: container {c['name']} runs {c.get('image')}, want {want}")
    # Apart from those two, exactly the overlay's objects.
    stripped = copy.deepcopy(objs)
    for o in stripped:
        (o["metadata"].get("labels") or {}).pop("app.kubernetes.io/version", None)
        if o["metadata"].get("labels") == {}:
            del o["metadata"]["labels"]
        for c in containers(o):
            c["image"] = unpinned.get((o["kind"], o["metadata"]["name"], c["name"]))
    key = lambda o: (o["kind"], o["metadata"]["name"])
    if sorted(stripped, key=key) != sorted(expected, key=key):
        errors.append("the objects differ from the overlay's render beyond the image and the version label")
    return errors


class RenderTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        cls.out = os.path.join(cls.tmp, "release")
        done = render_sh("--version", VERSION, "--digest", DIGEST, "--image", IMAGE, "--gateway-digest",
                         GATEWAY_DIGEST, "--gateway-image", GATEWAY_IMAGE, out=cls.out)
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
                # decode, prefill, the gateway; the cachestore's shards.
                self.assertEqual(len([o for o in objs if o["kind"] == "Deployment"]), 3)
                self.assertEqual([o["metadata"]["name"] for o in objs if o["kind"] == "StatefulSet"],
                                 ["hybridserve-cachestore"])
                # The gateway on its own image, its model copy on decode's.
                gateway = m.one(objs, "Deployment", "hybridserve-gateway")["spec"]["template"]["spec"]
                self.assertEqual(gateway["containers"][0]["image"], f"{GATEWAY_IMAGE}@{GATEWAY_DIGEST}")
                self.assertEqual([c["image"] for c in gateway.get("initContainers", [])],
                                 [] if overlay.startswith("gpu") else [f"{IMAGE}@{DIGEST}"])
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
        # The gateway on the workers' digest, its model copy on the gateway's.
        objs = copy.deepcopy(self.files["cpu"][1])
        gateway = m.one(objs, "Deployment", "hybridserve-gateway")["spec"]["template"]["spec"]
        gateway["containers"][0]["image"] = f"{IMAGE}@{DIGEST}"
        self.assertIn(f"Deployment/hybridserve-gateway: container gateway runs {IMAGE}@{DIGEST}, want "
                      f"{GATEWAY_IMAGE}@{GATEWAY_DIGEST}", release_errors(objs, m.render("cpu")))
        objs = copy.deepcopy(self.files["cpu"][1])
        gateway = m.one(objs, "Deployment", "hybridserve-gateway")["spec"]["template"]["spec"]
        gateway["initContainers"][0]["image"] = f"{GATEWAY_IMAGE}@{GATEWAY_DIGEST}"
        self.assertIn(f"Deployment/hybridserve-gateway: container model runs {GATEWAY_IMAGE}@{GATEWAY_DIGEST}, want "
                      f"{IMAGE}@{DIGEST}", release_errors(objs, m.render("cpu")))

    def test_refuses_bad_flags(self):
        gateway = ["--gateway-digest", GATEWAY_DIGEST]
        for args, flag in ((["--version", VERSION, *gateway], "--digest"),
                           (["--version", VERSION, "--digest", "sha256:abc", *gateway], "--digest"),
                           (["--version", VERSION, "--digest", DIGEST.upper(), *gateway], "--digest"),
                           (["--digest", DIGEST, *gateway], "--version"),
                           (["--version", "1.2 3", "--digest", DIGEST, *gateway], "--version"),
                           (["--version", VERSION, "--digest", DIGEST, *gateway, "--image", f"{IMAGE}@{DIGEST}"],
                            "--image"),
                           (["--version", VERSION, "--digest", DIGEST], "--gateway-digest"),
                           (["--version", VERSION, "--digest", DIGEST, "--gateway-digest", "sha256:abc"],
                            "--gateway-digest"),
                           (["--version", VERSION, "--digest", DIGEST, *gateway, "--image", f"{IMAGE}:1.2.3"],
                            "--image"),
                           (["--version", VERSION, "--digest", DIGEST, *gateway, "--gateway-image",
                             f"{GATEWAY_IMAGE}:1.2.3"], "--gateway-image"),
                           (["--version", VERSION, "--digest", DIGEST, *gateway, "--gateway-image",
                             f"{GATEWAY_IMAGE}@{GATEWAY_DIGEST}"], "--gateway-image")):
            with self.subTest(args=args):
                out = os.path.join(self.tmp, "refused")
                done = render_sh(*args, out=out)
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertIn(f"render.sh: {flag} must be", done.stderr)
                self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
